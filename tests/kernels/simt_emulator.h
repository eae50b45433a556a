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
// fibers). Misaligned vector accesses through kernels/cuda/dtype_utils.cuh
// (Load16, Load8, LoadPacked, StorePacked) abort, as the device would fault;
// other reinterpret_casts are not checked. What it does not model: the device
// memory model beyond barriers, timing, register limits, caches. Not for
// sanitizer builds (stack switching).
//
// Profiler (emu::ProfileBegin / emu::ProfileEnd): the memory accesses a kernel
// marks (PAGEDSERVE_GLOBAL_READ, PAGEDSERVE_SHARED of
// kernels/cuda/dtype_utils.cuh) are grouped into warp instructions: the n-th
// access of mark m by each thread of warp w in a block is one instruction
// (the device's SIMT model with reconvergence; a thread that skips a marked
// access in a divergent branch is an inactive lane). Per instruction, as the
// CUDA C++ Programming Guide and Nsight Compute count them:
//   global  sectors: the distinct 32-byte sectors its threads touch; useful
//           sectors: ceil(distinct bytes asked for / 32) (coalescing: 1.0 is
//           ideal; 32 threads reading 4 bytes each 32 bytes apart are 8.0).
//   shared  per phase (32 threads for accesses of up to 4 bytes, 16 for 8,
//           8 for 16: one 128-byte wavefront each), the most distinct 4-byte
//           words that fall into one of the 32 banks; the same word read by
//           several threads is one (broadcast). ways = the largest of these,
//           wavefronts = their sum (ideal: one per phase).
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
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
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

// ---- Profiler: marked global reads and shared accesses, grouped into warp
// instructions (see the top of this file).
enum class Space : uint8_t { kGlobal, kShared };

// Counters of one marked access (a site) or of all sites of one space.
struct AccessCounters {
  uint64_t instructions = 0;      // warp instructions
  uint64_t accesses = 0;          // thread accesses (active lanes)
  uint64_t bytes = 0;             // distinct bytes asked for, summed over instructions
  uint64_t sectors = 0;           // global: 32-byte sectors touched
  uint64_t block_sectors = 0;     // global: distinct sectors per thread block, summed
  uint64_t useful_sectors = 0;    // global: ceil(distinct bytes / 32) per instruction
  uint64_t wavefronts = 0;        // shared: sum over phases of the busiest bank's words
  uint64_t ideal_wavefronts = 0;  // shared: phases with an active lane
  int max_ways = 0;               // shared: busiest bank of any phase (1: conflict-free)
  void Add(const AccessCounters& o) {
    instructions += o.instructions;
    accesses += o.accesses;
    bytes += o.bytes;
    sectors += o.sectors;
    block_sectors += o.block_sectors;
    useful_sectors += o.useful_sectors;
    wavefronts += o.wavefronts;
    ideal_wavefronts += o.ideal_wavefronts;
    max_ways = std::max(max_ways, o.max_ways);
  }
  // Global: sectors per useful sector (1.0: fully coalesced).
  double SectorRatio() const {
    return useful_sectors ? static_cast<double>(sectors) / static_cast<double>(useful_sectors) : 0;
  }
  // Shared: wavefronts per ideal wavefront (1.0: no bank conflict).
  double WavefrontRatio() const {
    return ideal_wavefronts
               ? static_cast<double>(wavefronts) / static_cast<double>(ideal_wavefronts)
               : 0;
  }
};

// A marked access in the kernel source: file, line and the expansion's
// __COUNTER__ (two marks on one line are two sites).
struct Site {
  const char* file;
  int line;
  int counter;
  Space space;
  int nth_on_line = 0;  // 0: the line's first mark that ProfileEnd reports, 1: second, ...
  // "file.cuh:LINE", then "b", "c", ... for a line's later marks.
  std::string Name() const {
    const char* slash = std::strrchr(file, '/');
    std::string n = std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
    if (nth_on_line > 0) n += static_cast<char>('a' + nth_on_line);
    return n;
  }
};

// What ProfileEnd returns: per site (ordered by file and line) and per space.
struct Profile {
  std::vector<std::pair<Site, AccessCounters>> sites;
  AccessCounters global, shared;
};

struct Profiler {
  struct Access {
    uint16_t lane;
    uint16_t bytes;
    uintptr_t addr;
  };
  bool on = false;
  std::vector<Site> sites;
  std::map<std::tuple<const char*, int, int>, int> site_ids;
  std::vector<AccessCounters> counters;  // by site id
  // This block's accesses by (site id, warp, occurrence), and each thread's
  // occurrence count per site.
  std::unordered_map<uint64_t, std::vector<Access>> pending;
  std::vector<std::vector<uint32_t>> occurrence;  // [thread][site id]
};

inline Profiler& Prof() {
  static Profiler p;
  return p;
}

inline int SiteId(Space space, const char* file, int line, int counter) {
  Profiler& p = Prof();
  const auto key = std::make_tuple(file, line, counter);
  auto it = p.site_ids.find(key);
  if (it != p.site_ids.end()) return it->second;
  const int id = static_cast<int>(p.sites.size());
  if (id >= (1 << 16)) {
    std::fprintf(stderr, "simt_emulator: more than 65536 profiled sites\n");
    std::abort();
  }
  p.sites.push_back({file, line, counter, space, 0});
  p.counters.emplace_back();
  p.site_ids.emplace(key, id);
  return id;
}

// Records one thread's access of `bytes` at p for the current block (a no-op
// unless profiling); returns p.
template <typename P>
P* MarkAccess(P* p, size_t bytes, Space space, const char* file, int line, int counter) {
  Profiler& prof = Prof();
  if (!prof.on) return p;
  const int id = SiteId(space, file, line, counter);
  const unsigned tid = ::pagedserve::kernels::cuda::threadIdx.x;
  if (prof.occurrence.size() <= tid) prof.occurrence.resize(tid + 1);
  std::vector<uint32_t>& occ = prof.occurrence[tid];
  if (occ.size() <= static_cast<size_t>(id)) occ.resize(id + 1, 0);
  const uint64_t key =
      (static_cast<uint64_t>(id) << 48) | (static_cast<uint64_t>(tid / 32) << 32) | occ[id]++;
  prof.pending[key].push_back({static_cast<uint16_t>(tid % 32), static_cast<uint16_t>(bytes),
                               reinterpret_cast<uintptr_t>(p)});
  return p;
}

// The bytes an instruction's threads ask for, each byte once.
inline uint64_t DistinctBytes(const std::vector<Profiler::Access>& acc) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [begin, end)
  ranges.reserve(acc.size());
  for (const auto& a : acc) ranges.emplace_back(a.addr, a.addr + a.bytes);
  std::sort(ranges.begin(), ranges.end());
  uint64_t bytes = 0;
  uintptr_t covered = 0;
  for (const auto& [b, e] : ranges) {
    const uintptr_t from = std::max(b, covered);
    if (e > from) bytes += e - from;
    covered = std::max(covered, e);
  }
  return bytes;
}

// Sorts and deduplicates v.
inline void SortUnique(std::vector<uintptr_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// One global warp instruction: the sectors it touches (also appended to
// *block_sectors), the bytes it asks for.
inline void CountGlobal(const std::vector<Profiler::Access>& acc, AccessCounters* c,
                        std::vector<uintptr_t>* block_sectors) {
  std::vector<uintptr_t> sectors;
  for (const auto& a : acc)
    for (uintptr_t s = a.addr / 32; s <= (a.addr + a.bytes - 1) / 32; ++s) sectors.push_back(s);
  SortUnique(sectors);
  block_sectors->insert(block_sectors->end(), sectors.begin(), sectors.end());
  const uint64_t bytes = DistinctBytes(acc);
  c->bytes += bytes;
  c->sectors += sectors.size();
  c->useful_sectors += (bytes + 31) / 32;
}

// One shared warp instruction: per phase, the busiest bank's distinct words.
inline void CountShared(const std::vector<Profiler::Access>& acc, AccessCounters* c) {
  const int width = acc.front().bytes;
  const int lanes_per_phase = width <= 4 ? 32 : 128 / width;
  std::vector<std::vector<uintptr_t>> words(32 / lanes_per_phase);  // per phase
  for (const auto& a : acc)
    for (uintptr_t w = a.addr / 4; w <= (a.addr + a.bytes - 1) / 4; ++w)
      words[a.lane / lanes_per_phase].push_back(w);
  c->bytes += DistinctBytes(acc);
  for (auto& w : words) {
    if (w.empty()) continue;
    SortUnique(w);
    int per_bank[32] = {};
    for (uintptr_t x : w) ++per_bank[x % 32];
    const int ways = *std::max_element(per_bank, per_bank + 32);
    c->wavefronts += ways;
    c->ideal_wavefronts += 1;
    c->max_ways = std::max(c->max_ways, ways);
  }
}

// At the end of every block (EmuLaunch): the block's instructions into the
// per-site counters. block_sectors counts a sector once per block and site
// (a block reading one sector again, e.g. the other half of a 32-byte row,
// is taken to hit in its SM's L1; every other block reads it again).
inline void FlushBlockProfile() {
  Profiler& p = Prof();
  if (!p.on) return;
  std::map<uint64_t, std::vector<uintptr_t>> block_sectors;  // by site id
  for (auto& [key, acc] : p.pending) {
    AccessCounters& c = p.counters[key >> 48];
    c.instructions += 1;
    c.accesses += acc.size();
    if (p.sites[key >> 48].space == Space::kGlobal) {
      CountGlobal(acc, &c, &block_sectors[key >> 48]);
    } else {
      CountShared(acc, &c);
    }
  }
  for (auto& [id, sectors] : block_sectors) {
    SortUnique(sectors);
    p.counters[id].block_sectors += sectors.size();
  }
  p.pending.clear();
  for (auto& o : p.occurrence) std::fill(o.begin(), o.end(), 0u);
}

// Starts counting the marked accesses of the launches that follow.
inline void ProfileBegin() {
  Profiler& p = Prof();
  p.on = true;
  p.pending.clear();
  p.occurrence.clear();
  for (auto& c : p.counters) c = AccessCounters{};
}

// Stops counting; the counters since ProfileBegin (sites that saw no access
// are left out).
inline Profile ProfileEnd() {
  Profiler& p = Prof();
  FlushBlockProfile();
  p.on = false;
  Profile r;
  for (size_t i = 0; i < p.sites.size(); ++i) {
    if (p.counters[i].instructions == 0) continue;
    r.sites.emplace_back(p.sites[i], p.counters[i]);
    (p.sites[i].space == Space::kGlobal ? r.global : r.shared).Add(p.counters[i]);
  }
  std::sort(r.sites.begin(), r.sites.end(), [](const auto& a, const auto& b) {
    const int f = std::strcmp(a.first.file, b.first.file);
    if (f != 0) return f < 0;
    return std::tie(a.first.line, a.first.counter) < std::tie(b.first.line, b.first.counter);
  });
  for (size_t i = 1; i < r.sites.size(); ++i) {
    const Site& prev = r.sites[i - 1].first;
    Site& cur = r.sites[i].first;
    if (std::strcmp(prev.file, cur.file) == 0 && prev.line == cur.line)
      cur.nth_on_line = prev.nth_on_line + 1;
  }
  return r;
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

// Every lane of the warp must call it (as with a full mask on the device).
inline void __syncwarp(unsigned = 0xffffffffu) {
  emu::CurrentBlock()->warp_barriers[threadIdx.x / 32].Wait();
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
        emu::FlushBlockProfile();
        emu::CurrentBlock() = nullptr;
      }
    }
  }
}

}  // namespace pagedserve::kernels::cuda

// The WMMA API (mma.h) for m16n16k16 tiles, as the tensor-core kernels use
// it: fill_fragment, load_matrix_sync, mma_sync, store_matrix_sync. On the
// device a fragment's per-lane layout is unspecified, so code that only
// passes fragments to these functions cannot depend on it; here every lane
// holds the whole A / B tile (exact float copies of the 16-bit values), and
// of an accumulator the elements e = lane + 32 * i of the row-major 16 x 16
// tile (others NaN). mma_sync computes a lane's elements with fp32
// accumulation in k order (the device's order and rounding within the tensor
// core differ: tests compare with tolerances). Loads and stores are warp
// collectives: every lane of the warp must call them, and they synchronize
// the warp before and after (no lane stores a tile another lane has yet to
// load).
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator models m16n16k16 only");
  float x[256];  // [row][col]: A [m][k], B [k][n], accumulator [m][n]
};

namespace emu {
inline int Lane() { return static_cast<int>(::pagedserve::kernels::cuda::threadIdx.x % 32); }
inline void WarpSync() { ::pagedserve::kernels::cuda::__syncwarp(); }
inline float ToF(float v) { return v; }
inline float ToF(__half v) { return __half2float(v); }
inline float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename Layout>
constexpr bool kRowMajor = std::is_same_v<Layout, row_major>;
// The device's rules for a tile pointer and its leading dimension: ldm a
// multiple of 16 bytes' worth of elements, and a pointer into shared memory
// 256-bit aligned relative to the dynamic shared memory's start (the device
// aligns that start to at least 128 bytes). Aborts with a message otherwise.
template <typename T>
void CheckTile(const T* p, unsigned ldm) {
  const auto* block = ::pagedserve::kernels::cuda::emu::CurrentBlock();
  const auto base = reinterpret_cast<uintptr_t>(block->smem.data());
  const auto q = reinterpret_cast<uintptr_t>(p);
  const bool shared = q >= base && q < base + block->smem.size() * sizeof(block->smem[0]);
  if ((ldm * sizeof(T)) % 16 != 0 || (shared && (q - base) % 32 != 0)) {
    std::fprintf(stderr, "wmma: ldm %u (%zu-byte elements) or shared offset %zu not allowed\n", ldm,
                 sizeof(T), shared ? static_cast<size_t>(q - base) : size_t{0});
    std::abort();
  }
}
}  // namespace emu

// An A or B operand tile ([m][k] / [k][n] as stored, by its layout).
template <
    typename Use, typename T, typename Layout,
    typename = std::enable_if_t<std::is_same_v<Use, matrix_a> || std::is_same_v<Use, matrix_b>>>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  emu::CheckTile(p, ldm);
  emu::WarpSync();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = emu::ToF(emu::kRowMajor<Layout> ? p[r * ldm + c] : p[c * ldm + r]);
  emu::WarpSync();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  emu::CheckTile(p, ldm);
  emu::WarpSync();
  std::fill(f.x, f.x + 256, std::numeric_limits<float>::quiet_NaN());
  for (int e = emu::Lane(); e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
  emu::WarpSync();
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  std::fill(f.x, f.x + 256, v);
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  for (int e = emu::Lane(); e < 256; e += 32) {
    const int r = e / 16, n = e % 16;
    float sum = c.x[e];
    for (int k = 0; k < 16; ++k) sum += a.x[r * 16 + k] * b.x[k * 16 + n];
    d.x[e] = sum;
  }
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  emu::CheckTile(p, ldm);
  emu::WarpSync();
  for (int e = emu::Lane(); e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
  emu::WarpSync();
}

}  // namespace nvcuda::wmma

#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
// The profiler's marks (the kernels' own definitions are p itself).
#define PAGEDSERVE_GLOBAL_READ(p, bytes)                                                         \
  ::pagedserve::kernels::cuda::emu::MarkAccess((p), (bytes),                                     \
                                               ::pagedserve::kernels::cuda::emu::Space::kGlobal, \
                                               __FILE__, __LINE__, __COUNTER__)
#define PAGEDSERVE_SHARED(p)                                                                     \
  ::pagedserve::kernels::cuda::emu::MarkAccess((p), sizeof(*(p)),                                \
                                               ::pagedserve::kernels::cuda::emu::Space::kShared, \
                                               __FILE__, __LINE__, __COUNTER__)
#define PAGEDSERVE_DYNAMIC_SHARED(type, name) \
  type* name =                                \
      reinterpret_cast<type*>(::pagedserve::kernels::cuda::emu::CurrentBlock()->smem.data())

#endif  // PAGEDSERVE_TESTS_KERNELS_SIMT_EMULATOR_H_
