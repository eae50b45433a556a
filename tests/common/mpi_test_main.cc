// The main() of the GTest binaries run under mpirun (communicator_mpi_test,
// worker_decode_graph_tp_test): MPI_Init, the tests on every rank (each rank
// prints its report), and the worst exit code over the ranks, so that a
// failure on any rank fails the run.
#include <mpi.h>

#include <cstdio>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0 && rank == 0) std::fprintf(stderr, "a test failed on some rank\n");
  MPI_Finalize();
  return worst;
}
