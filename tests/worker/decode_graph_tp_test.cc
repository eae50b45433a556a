// Captured decode steps under tensor parallelism, on the CPU: 2 MPI ranks
// (mpirun -n 2), each running its shard of the random-weight Llama through
// CaptureBackend (decode_graph_harness.h), which behaves as the CUDA
// backend's graphs do. A rank's capture may fail while its peer's succeeds
// (a CUDA capture fails for reasons local to a rank, e.g. an operation that
// cannot be captured there): the failing rank runs that body again eagerly
// and its later steps of the key eagerly, while the peer launches and then
// replays its graph. Both issue the same all-reduces in the same order, so
// nothing hangs and every rank's logits equal the eager run's bit for bit
// (the sum of two partial results is the same either way round). A replay
// that skipped collectives would deadlock here instead of failing, so the
// negative controls stay in the single-rank decode_graph_test.
#include <mpi.h>

#include <vector>

#include "distributed/communicator.h"
#include "gtest/gtest.h"
#include "tests/worker/decode_graph_harness.h"

namespace pagedserve {
namespace {

using testing::Fault;
using testing::RunSchedule;
using testing::Schedule;
using testing::ScheduleDiff;
using testing::TestModel;

TEST(DecodeGraphTpTest, RanksWhoseCapturesDifferMatchTheEagerRun) {
  const char* path = TestModel();
  ASSERT_NE(path, nullptr) << "PAGEDSERVE_TEST_MODEL is not set";
  auto comm = MakeMpiCommunicator(MPI_COMM_WORLD);
  ASSERT_EQ(comm->size(), 2) << "run with mpirun -n 2";
  const Schedule eager = RunSchedule(path, false, Fault::kNone, comm.get());
  ASSERT_EQ(eager.logits.size(), 24u);

  // Both ranks capture and replay.
  const Schedule both = RunSchedule(path, true, Fault::kNone, comm.get());
  EXPECT_EQ(both.captures, 3);
  EXPECT_EQ(both.replays, 24 - 6);
  EXPECT_EQ(ScheduleDiff(both, eager), 0.0);

  // Rank 0's captures all fail (eager reruns, then eager steps); rank 1 replays.
  const bool failing = comm->rank() == 0;
  const Schedule mixed =
      RunSchedule(path, true, failing ? Fault::kCaptureFails : Fault::kNone, comm.get());
  EXPECT_EQ(mixed.failed_captures, failing ? 3 : 0);
  EXPECT_EQ(mixed.replays, failing ? 0 : 24 - 6);
  EXPECT_EQ(ScheduleDiff(mixed, eager), 0.0);

  // Every rank ends with the same logits (the LM head is replicated).
  std::vector<float> last = mixed.logits.empty() ? std::vector<float>() : mixed.logits.back();
  std::vector<float> peer(last.size());
  const int other = 1 - comm->rank();
  MPI_Sendrecv(last.data(), static_cast<int>(last.size()), MPI_FLOAT, other, 7, peer.data(),
               static_cast<int>(peer.size()), MPI_FLOAT, other, 7, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  EXPECT_EQ(last, peer);
}

}  // namespace
}  // namespace pagedserve
