#!/usr/bin/env bash
# Decode throughput of the mpirun process model at TP = 1 and TP = 2, side by
# side: one coordinator rank plus TP worker ranks, one BLAS/OpenMP thread per
# rank, greedy decoding of B sequences on the random-weight test model.
# Per decode-inclusive step it reports the time rank 0 spends handing the step
# plan to the workers (send = serialize + MPI sends), waiting for TP rank 0's
# result, and TP rank 0's own forward and all-reduce times.
#
#   bench/tp_decode.sh [BUILD_DIR] [MODEL_DIR]
#   env: SEQS (default 8), TOKENS (default 32), REPEATS (default 3)
set -euo pipefail
build=${1:-build}
model=${2:-$build/models/random_llama}
driver=$build/tests/distributed/pagedserve_tp_driver
seqs=${SEQS:-8}
tokens=${TOKENS:-32}
repeats=${REPEATS:-3}
[[ -x $driver ]] || { echo "build the driver first: cmake --build $build --target pagedserve_tp_driver" >&2; exit 2; }
[[ -f $model/config.json ]] || { echo "no model at $model (python3 tests/fixtures/make_random_llama.py $model)" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "model=$model seqs=$seqs tokens/seq=$tokens repeats=$repeats nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-4s %-3s %12s %10s %10s %12s %14s\n' TP rep "decode tok/s" "send ms" "wait ms" "forward ms" "collective ms"
for rep in $(seq 1 "$repeats"); do
  for tp in 1 2; do
    out=$(mpirun -np $((tp + 1)) --oversubscribe --bind-to none "$driver" --model "$model" --tp "$tp" \
          --bench-seqs "$seqs" --max-tokens "$tokens" 2>/dev/null | grep '^stats')
    get() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$out"; }
    printf '%-4s %-3s %12s %10s %10s %12s %14s\n' "$tp" "$rep" "$(get decode_tok_per_s)" \
      "$(get send_ms_per_step)" "$(get wait_ms_per_step)" "$(get worker_forward_ms_per_step)" \
      "$(get worker_collective_ms_per_step)"
  done
done
