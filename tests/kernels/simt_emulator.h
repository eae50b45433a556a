// A small CPU emulator of the CUDA execution model, just enough to run the
// kernel templates of kernels/cuda/*_kernels.cuh on the host, so that their
// indexing, masking and reductions are tested on machines without a GPU.
//
// One thread block at a time; each CUDA thread is a std::thread. __syncthreads
// is a std::barrier over the block; warp shuffles exchange through a per-warp
// array between two arrivals at a per-warp barrier (every lane of the warp
// must call them, as with a full mask on the device). __shared__ variables
// become function-local statics (one block runs at a time, so they are
// block-shared); dynamic shared memory is a buffer filled with NaN before every
// block, so that reading a slot the kernel did not write shows up in results.
//
// What it does not model: the device memory model beyond barriers, bank
// conflicts, timing, register limits, alignment faults.
//
// Include this header INSTEAD of a CUDA compiler: it includes the CUDA headers
// for the types (uint4, __half, ...) and must come before the kernel headers.
#ifndef PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_
#define PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#ifdef __CUDACC__
#error "simt_emulator.h is for host compilers"
#endif

namespace pagedserve::kernels::cuda {

namespace emu {

struct Block {
  explicit Block(int threads, size_t smem_bytes)
      : block_barrier(threads), smem((smem_bytes + 15) / 16 + 1) {
    const int warps = (threads + 31) / 32;
    for (int w = 0; w < warps; ++w) {
      warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32, threads - 32 * w)));
      exchange.emplace_back(32, 0u);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    float* f = reinterpret_cast<float*>(smem.data());
    std::fill(f, f + smem.size() * 4, nan);
  }
  std::barrier<> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<std::vector<uint32_t>> exchange;  // [warp][lane], raw 32-bit values
  std::vector<uint4> smem;                      // 16-byte aligned dynamic shared memory
};

inline Block*& CurrentBlock() {
  static Block* b = nullptr;
  return b;
}

}  // namespace emu

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

inline void __syncthreads() { emu::CurrentBlock()->block_barrier.arrive_and_wait(); }

inline uint32_t EmuShuffle(uint32_t v, int src_lane) {
  emu::Block* b = emu::CurrentBlock();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  b->exchange[warp][lane] = v;
  b->warp_barriers[warp]->arrive_and_wait();
  const uint32_t r = b->exchange[warp][src_lane];
  b->warp_barriers[warp]->arrive_and_wait();
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
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// Runs `kernel` (a callable taking no arguments that calls the kernel
// function) over the grid, one block at a time.
inline void EmuLaunch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& kernel) {
  const int threads = static_cast<int>(block.x * block.y * block.z);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        emu::Block b(threads, smem_bytes);
        emu::CurrentBlock() = &b;
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
            blockIdx = uint3{x, y, z};
            blockDim = block;
            gridDim = grid;
            kernel();
          });
        }
        for (auto& th : pool) th.join();
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
  type* name = reinterpret_cast<type*>(::pagedserve::kernels::cuda::emu::CurrentBlock()->smem.data())

#endif  // PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_
