/* A floor under explicit thread stack sizes in the pagedserve binary.
 *
 * Debian's civetweb (under prometheus-cpp's Exposer, the /metrics endpoint)
 * creates its worker threads with a fixed ~100 KiB stack (USE_STACK_SIZE).
 * glibc carves every thread's static TLS out of that stack, and the CUDA
 * libraries a CUDA build links (libcudart, libnccl) bring 4-12 KiB blocks with
 * page alignment: the civetweb workers then overflow their stacks and the
 * process dies on the first scrape. civetweb has no option for its stack size,
 * so the binary interposes pthread_attr_setstacksize and raises requests below
 * 1 MiB to 1 MiB (virtual memory; pages are touched only when used).
 * Exported from the executable with --export-dynamic-symbol (runtime/cli/CMakeLists.txt). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

enum { kPagedserveMinThreadStack = 1 << 20 };

int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) {
  typedef int (*setstacksize_fn)(pthread_attr_t*, size_t);
  static setstacksize_fn real = NULL;
  if (real == NULL) real = (setstacksize_fn)dlsym(RTLD_NEXT, "pthread_attr_setstacksize");
  if (stacksize < kPagedserveMinThreadStack) stacksize = kPagedserveMinThreadStack;
  return real(attr, stacksize);
}
