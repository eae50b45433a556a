// The main() of the GTest binaries run under mpirun (communicator_mpi_test,
// worker_decode_graph_tp_test): MPI_Init, the tests on every rank (each rank
// prints its report), then one exit status for every rank, so that mpirun
// returns it: 1 when a test failed (or skipped for a reason
// PAGEDSERVE_ALLOWED_SKIPS does not allow) on any rank, else 77 when a test
// skipped on any rank (CTest SKIP_RETURN_CODE: listed as skipped, never as
// passed; tests/common/skip_policy.h), else 0.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/common/skip_policy.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int rc = RUN_ALL_TESTS();
  const int code = pagedserve::testing::ExitCodeAfterRun(rc, "rank " + std::to_string(rank) + ": ");
  // Severity: failed (2) > skipped (1) > passed (0); the worst over the ranks.
  const int mine = code == 0 ? 0 : code == pagedserve::testing::kSkipExitCode ? 1 : 2;
  int worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst == 2 && rank == 0) std::fprintf(stderr, "a test failed on some rank\n");
  if (worst == 1 && rank == 0) std::fprintf(stderr, "a test skipped on some rank\n");
  MPI_Finalize();
  return worst == 2 ? 1 : worst == 1 ? pagedserve::testing::kSkipExitCode : 0;
}
