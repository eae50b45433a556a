// The worker ranks' side of the process model (world ranks 1..TP under
// mpirun; see mpi_process.h and docs/distributed.md).
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_WORKER_RANK_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_WORKER_RANK_H_

#include "runtime/launch/mpi_process.h"
#include "runtime/worker/worker.h"

namespace pagedserve {

// Worker ranks: loads the shard (Worker::Create over a TP communicator of the
// worker ranks), reports its block counts (or its setup error)
// to the coordinator, then runs plans until a shutdown plan. TP rank 0 returns
// each step's result; any rank that fails a step sends the error and refuses
// every later step plan (the coordinator stops). Signals: SIGINT is ignored
// (the coordinator decides); after SIGTERM the rank keeps serving plans but
// exits if it makes no progress for kDefaultStepTimeout (a rank stuck in a
// collective with a dead peer), and a rank whose coordinator process is gone
// (same host) exits. Returns 0 after a shutdown plan, non-zero after a setup
// failure or an abort from the coordinator (2 when called on the coordinator
// or without mpirun).
//
// Device: with PAGEDSERVE_WORKER_DEVICE unset or "auto", a rank runs on CUDA
// when options.device is kCUDA or when the build has CUDA and a device answers
// (kernels::CudaDeviceAvailable); its device is its rank among the worker
// ranks on the same host (MPI_Comm_split_type SHARED) modulo the device count,
// and its collectives are NCCL (device buffers). Otherwise, or with
// PAGEDSERVE_WORKER_DEVICE=cpu, it runs on the CPU with MPI collectives.
// PAGEDSERVE_WORKER_DEVICE=cuda forces CUDA (a setup error without a device).
// Under mpirun pass the variable to the ranks (-x PAGEDSERVE_WORKER_DEVICE).
//
// Call after InitMpi, on the thread that called it; then FinalizeMpi.
int RunWorkerRank(const LaunchInfo& info, const WorkerOptions& options);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_WORKER_RANK_H_
