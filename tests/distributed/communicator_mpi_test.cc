// MPI communicator collectives, run under `mpirun -np 2` (any size works):
// AllReduceSum and AllGather against the closed-form sums, over the whole
// world and over a sub-communicator that leaves rank 0 out (the TP group of
// the process model). The single-rank communicator is checked on every rank.
#include <mpi.h>

#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "distributed/communicator.h"

namespace pagedserve {
namespace {

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int WorldSize() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

TEST(MpiCommunicator, RankAndSizeMatchTheWorld) {
  auto comm = MakeMpiCommunicator(MPI_COMM_WORLD);
  EXPECT_EQ(comm->rank(), WorldRank());
  EXPECT_EQ(comm->size(), WorldSize());
  EXPECT_STREQ(comm->backend(), "mpi");
  EXPECT_GE(WorldSize(), 2) << "run this test under mpirun -np 2 or more";
}

TEST(MpiCommunicator, AllReduceSum) {
  auto comm = MakeMpiCommunicator(MPI_COMM_WORLD);
  const int n = comm->size(), r = comm->rank();
  // Sizes around typical hidden sizes, odd ones and one element.
  for (size_t count : {size_t{1}, size_t{7}, size_t{576}, size_t{4099}}) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((r + 1) * 1000 + i % 13);
    ASSERT_TRUE(comm->AllReduceSum(data.data(), count).ok());
    // sum over ranks of (r+1)*1000 + i%13 = 1000 n(n+1)/2 + n (i%13)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(data[i], 1000.0f * n * (n + 1) / 2 + n * static_cast<float>(i % 13)) << i;
  }
  EXPECT_GT(comm->collective_seconds(), 0.0);
}

// The asynchronous form on a host communicator: fp32 is the same sum (the
// stream is ignored); 16-bit payloads are for device communicators only.
TEST(MpiCommunicator, AllReduceSumAsyncOnTheHost) {
  auto comm = MakeMpiCommunicator(MPI_COMM_WORLD);
  const int n = comm->size(), r = comm->rank();
  std::vector<float> data = {static_cast<float>(r + 1), 0.5f};
  ASSERT_TRUE(
      comm->AllReduceSumAsync(data.data(), 2, Communicator::ReduceType::kFloat32, nullptr).ok());
  EXPECT_EQ(data[0], 0.5f * static_cast<float>(n * (n + 1)));
  EXPECT_EQ(data[1], 0.5f * n);
  EXPECT_TRUE(comm->CheckAsyncError().ok());
  std::vector<uint16_t> half(2, 0);
  const absl::Status s =
      comm->AllReduceSumAsync(half.data(), 2, Communicator::ReduceType::kBFloat16, nullptr);
  if (n > 1) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(MpiCommunicator, AllGather) {
  auto comm = MakeMpiCommunicator(MPI_COMM_WORLD);
  const int n = comm->size(), r = comm->rank();
  const size_t count = 33;
  std::vector<float> in(count), out(count * n, -1.0f);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r * 100 + i);
  ASSERT_TRUE(comm->AllGather(in.data(), out.data(), count).ok());
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[q * count + i], static_cast<float>(q * 100 + i)) << q << " " << i;
}

TEST(MpiCommunicator, WorkerSubgroupWithoutRankZero) {
  // The TP group excludes the coordinator (world rank 0).
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, WorldRank() == 0 ? MPI_UNDEFINED : 0, WorldRank(), &sub);
  if (WorldRank() == 0) {
    EXPECT_EQ(sub, MPI_COMM_NULL);
    return;
  }
  auto comm = MakeMpiCommunicator(sub);
  EXPECT_EQ(comm->rank(), WorldRank() - 1);
  EXPECT_EQ(comm->size(), WorldSize() - 1);
  std::vector<float> v = {1.0f, static_cast<float>(WorldRank())};
  ASSERT_TRUE(comm->AllReduceSum(v.data(), v.size()).ok());
  const int w = WorldSize();
  EXPECT_EQ(v[0], static_cast<float>(w - 1));
  const int sum = (w - 1) * w / 2;  // 1 + ... + (w-1)
  EXPECT_EQ(v[1], static_cast<float>(sum));
  comm.reset();
  MPI_Comm_free(&sub);
}

TEST(SingleRankCommunicator, NoOpsAndCopy) {
  auto comm = MakeSingleRankCommunicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> v = {1.5f, -2.0f};
  ASSERT_TRUE(comm->AllReduceSum(v.data(), v.size()).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  // A group of one: every asynchronous form is a no-op.
  for (auto t : {Communicator::ReduceType::kFloat32, Communicator::ReduceType::kBFloat16})
    ASSERT_TRUE(comm->AllReduceSumAsync(v.data(), v.size(), t, nullptr).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  std::vector<float> out(2);
  ASSERT_TRUE(comm->AllGather(v.data(), out.data(), 2).ok());
  EXPECT_EQ(out, v);
}

#ifndef PAGEDSERVE_WITH_CUDA
TEST(NcclCommunicator, UnavailableWithoutCuda) {
  auto c = MakeNcclCommunicator(MPI_COMM_WORLD, 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
}
#endif

}  // namespace
}  // namespace pagedserve
