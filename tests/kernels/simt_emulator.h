// A small CPU emulator of the CUDA execution model, just enough to run the
// kernel templates of kernels/cuda/*_kernels.cuh on the host, so that their
// indexing, masking and reductions are tested on machines without a GPU.
//
// One thread block at a time; each CUDA thread is a fiber (ucontext for the
// first entry, _setjmp/_longjmp for every later switch) on the calling OS
// thread, scheduled round-robin. __syncthreads is a barrier over the block;
// warp shuffles exchange through a per-warp array between two arrivals at a
// per-warp barrier (every lane of the warp must call them, as with a full mask
// on the device). A barrier some threads can never reach (a divergent return)
// is detected and aborts with a message. __shared__ variables become
// function-local statics (one block runs at a time, so they are block-shared);
// dynamic shared memory is a buffer filled with NaN before every block, so that
// reading a slot the kernel did not write shows up in the results.
//
// Atomics are plain read-modify-writes (only barriers and shuffles switch
// fibers). What it does not model: the device memory model beyond barriers, bank
// conflicts, timing, register limits, alignment faults. Not for sanitizer
// builds (stack switching).
//
// Include this header INSTEAD of a CUDA compiler: it includes the CUDA headers
// for the types (uint4, __half, ...) and must come before the kernel headers.
#ifndef PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_
#define PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#ifdef __CUDACC__
#error "simt_emulator.h is for host compilers"
#endif

namespace pagedserve::kernels::cuda {

inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

namespace emu {

struct Fiber {
  jmp_buf jb;
  ucontext_t uc;
  bool started = false;
  bool done = false;
};

struct Scheduler {
  jmp_buf jb;
  Fiber* current = nullptr;
  uint64_t progress = 0;  // barrier completions and finished fibers
  const std::function<void()>* body = nullptr;
};

inline Scheduler& Sched() {
  static Scheduler s;
  return s;
}

inline void Yield() {
  Fiber* f = Sched().current;
  if (!_setjmp(f->jb)) _longjmp(Sched().jb, 1);
}

inline void FiberEntry() {
  (*Sched().body)();
  Sched().current->done = true;
  ++Sched().progress;
  _longjmp(Sched().jb, 1);
}

struct Barrier {
  int expected = 0;
  int count = 0;
  uint64_t generation = 0;
  void Wait() {
    const uint64_t g = generation;
    if (++count == expected) {
      count = 0;
      ++generation;
      ++Sched().progress;
      return;
    }
    while (generation == g) Yield();
  }
};

struct Block {
  Block(int threads, size_t smem_bytes) : smem((smem_bytes + 15) / 16 + 1) {
    block_barrier.expected = threads;
    const int warps = (threads + 31) / 32;
    warp_barriers.resize(warps);
    for (int w = 0; w < warps; ++w) warp_barriers[w].expected = std::min(32, threads - 32 * w);
    exchange.assign(warps, std::vector<uint32_t>(32, 0u));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    float* f = reinterpret_cast<float*>(smem.data());
    std::fill(f, f + smem.size() * 4, nan);
  }
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<std::vector<uint32_t>> exchange;  // [warp][lane], raw 32-bit values
  std::vector<uint4> smem;                      // 16-byte aligned dynamic shared memory
};

inline Block*& CurrentBlock() {
  static Block* b = nullptr;
  return b;
}

// Runs fiber f until it yields (Yield) or finishes (FiberEntry); both jump back to
// s.jb here. A function of its own so that no local of the caller's loop lives
// across _setjmp (GCC's -Wclobbered: a local modified between setjmp and longjmp
// is indeterminate afterwards).
inline void ResumeFiber(Scheduler& s, Fiber& f, char* stack, size_t stack_size) {
  if (_setjmp(s.jb)) return;
  if (!f.started) {
    f.started = true;
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = stack;
    f.uc.uc_stack.ss_size = stack_size;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, FiberEntry, 0);
    setcontext(&f.uc);
  } else {
    _longjmp(f.jb, 1);
  }
}

// Runs `threads` fibers of `body` to completion; fiber t sees threadIdx.x = t.
inline void RunBlock(int threads, const std::function<void()>& body) {
  constexpr size_t kStack = 256 * 1024;
  static std::vector<std::unique_ptr<char[]>> stacks;
  while (static_cast<int>(stacks.size()) < threads) stacks.emplace_back(new char[kStack]);
  std::vector<Fiber> fibers(threads);
  Scheduler& s = Sched();
  s.body = &body;
  int remaining = threads;
  const uint3 block_idx = blockIdx;
  while (remaining > 0) {
    const uint64_t before = s.progress;
    for (int t = 0; t < threads; ++t) {
      Fiber& f = fibers[t];
      if (f.done) continue;
      s.current = &f;
      threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
      blockIdx = block_idx;
      ResumeFiber(s, f, stacks[t].get(), kStack);
      if (f.done) --remaining;
    }
    if (remaining > 0 && s.progress == before) {
      std::fprintf(stderr,
                   "simt_emulator: deadlock in block (%u,%u,%u): %d threads wait at a "
                   "barrier the others cannot reach\n",
                   block_idx.x, block_idx.y, block_idx.z, remaining);
      std::abort();
    }
  }
}

}  // namespace emu

inline void __syncthreads() { emu::CurrentBlock()->block_barrier.Wait(); }

inline uint32_t EmuShuffle(uint32_t v, int src_lane) {
  emu::Block* b = emu::CurrentBlock();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  b->exchange[warp][lane] = v;
  b->warp_barriers[warp].Wait();
  const uint32_t r = b->exchange[warp][src_lane];
  b->warp_barriers[warp].Wait();
  return r;
}

inline float __shfl_xor_sync(unsigned, float v, int lane_mask, int width = 32) {
  const int lane = threadIdx.x % 32;
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;  // outside the segment
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = EmuShuffle(u, src);
  std::memcpy(&v, &u, 4);
  return v;
}

inline float __shfl_sync(unsigned, float v, int src_lane, int width = 32) {
  const int lane = threadIdx.x % 32;
  const int src = (lane & ~(width - 1)) + (src_lane % width);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = EmuShuffle(u, src);
  std::memcpy(&v, &u, 4);
  return v;
}

inline float __expf(float x) { return std::exp(x); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest float operations (never contracted into an FMA).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Atomics: fibers switch only at barriers and shuffles, so a plain
// read-modify-write is atomic here.
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
inline T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// Runs `kernel` (a callable that calls the kernel function) over the grid,
// one block at a time, block.x threads per block.
inline void EmuLaunch(dim3 grid, dim3 block, size_t smem_bytes,
                      const std::function<void()>& kernel) {
  const int threads = static_cast<int>(block.x * block.y * block.z);
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        emu::Block b(threads, smem_bytes);
        emu::CurrentBlock() = &b;
        blockIdx = uint3{x, y, z};
        emu::RunBlock(threads, kernel);
        emu::CurrentBlock() = nullptr;
      }
    }
  }
}

}  // namespace pagedserve::kernels::cuda

#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define PAGEDSERVE_DYNAMIC_SHARED(type, name) \
  type* name =                                \
      reinterpret_cast<type*>(::pagedserve::kernels::cuda::emu::CurrentBlock()->smem.data())

#endif  // PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_
