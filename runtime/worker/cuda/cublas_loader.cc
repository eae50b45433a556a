#include "runtime/worker/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace pagedserve {
namespace {

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) *error = absl::StrCat("cuBLAS symbol ", name, " not found: ", dlerror());
  return *fn != nullptr;
}

absl::StatusOr<const CublasApi*> Load() {
  const std::string soname = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("cannot load ", soname, ": ", dlerror()));
  static CublasApi api;
  std::string error;
  // cublas_v2.h maps cublasCreate etc. to these _v2 symbols.
  if (!Resolve(lib, "cublasCreate_v2", &api.create, &error) ||
      !Resolve(lib, "cublasDestroy_v2", &api.destroy, &error) ||
      !Resolve(lib, "cublasSetStream_v2", &api.set_stream, &error) ||
      !Resolve(lib, "cublasSetMathMode", &api.set_math_mode, &error) ||
      !Resolve(lib, "cublasSetWorkspace_v2", &api.set_workspace, &error) ||
      !Resolve(lib, "cublasSgemm_v2", &api.sgemm, &error) ||
      !Resolve(lib, "cublasGemmEx", &api.gemm_ex, &error))
    return absl::FailedPreconditionError(error);
  return &api;
}

}  // namespace

absl::StatusOr<const CublasApi*> LoadCublas() {
  static const absl::StatusOr<const CublasApi*>* loaded =
      new absl::StatusOr<const CublasApi*>(Load());
  return *loaded;
}

}  // namespace pagedserve
