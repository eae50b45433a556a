#!/usr/bin/env bash
# Prefill and decode tokens/s of SmolLM2 (or --gguf) at batch 1, 8 and 32:
# pagedserve's Worker (bench_model) and llama.cpp (bench/llamacpp_baseline.py,
# llama-cpp-python) on the same GGUF, the same thread count, the same prompt
# and the same method, one after the other in one run; prints one table with
# the ratios pagedserve / llama.cpp and writes both JSON files.
#
#   bench/model_side_by_side.sh [--build-dir build-bench] [--gguf PATH] [--threads 2]
#       [--batches 1,8,32] [--prompt-len 128] [--decode-steps 32] [--repeats 3]
#       [--out-dir DIR]
#
# Build first (Release, -march=native, as llama.cpp's own build is native):
#   cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDSERVE_NATIVE=ON \
#         -DPAGEDSERVE_CUDA=OFF -DPAGEDSERVE_BUILD_TESTS=OFF
#   cmake --build build-bench --target bench_model
# Both sides run with OMP_WAIT_POLICY=PASSIVE (the machine is shared); our side
# with OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = --threads, llama.cpp with
# n_threads = n_threads_batch = --threads. The table reports the best of
# --repeats iterations for both (llamacpp_baseline.py's convention) and the
# load average before each side.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=build-bench gguf="" threads=2 batches=1,8,32 prompt_len=128 decode_steps=32 repeats=3 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --gguf) gguf=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --prompt-len) prompt_len=$2; shift 2 ;;
    --decode-steps) decode_steps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --out-dir) out=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "model_side_by_side: unknown option '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$root/$build" ;; esac
bin="$build/bench/bench_model"
[ -x "$bin" ] || { echo "model_side_by_side: $bin not built (see --help)" >&2; exit 2; }
[ -n "$gguf" ] || gguf=$("$root/scripts/fetch-model")
[ -n "$out" ] || out=$(mktemp -d -t model_side_by_side.XXXXXX)
mkdir -p "$out"
export OMP_WAIT_POLICY=PASSIVE

load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "model_side_by_side: pagedserve (bench_model), load $(load)" >&2
load_ours=$(load)
OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$bin" --model="$gguf" --batches="$batches" \
  --prompt_len="$prompt_len" --decode_steps="$decode_steps" --repeats="$repeats" \
  --benchmark_out="$out/pagedserve.json" --benchmark_out_format=json >&2

echo "model_side_by_side: llama.cpp (llamacpp_baseline.py), load $(load)" >&2
load_llama=$(load)
python3 "$root/bench/llamacpp_baseline.py" --gguf "$gguf" --threads "$threads" --batches "$batches" \
  --prompt-len "$prompt_len" --decode-steps "$decode_steps" --repeats "$repeats" > "$out/llamacpp.json"

python3 - "$out" "$load_ours" "$load_llama" "$threads" <<'PY'
import json, re, sys
out, load_ours, load_llama, threads = sys.argv[1:]
ours = {}
for b in json.load(open(f"{out}/pagedserve.json"))["benchmarks"]:
    m = re.match(r"(prefill|decode)/batch:(\d+)", b["name"])
    if m:
        ours[(m.group(1), int(m.group(2)))] = b["tokens_per_s_best"]
llama = json.load(open(f"{out}/llamacpp.json"))
theirs = {}
for r in llama["results"]:
    theirs[("prefill", r["batch"])] = r["prefill_tokens_per_s"]
    theirs[("decode", r["batch"])] = r["decode_tokens_per_s"]
print(f"model {llama['model']}, {threads} threads, prompt {llama['results'][0]['prompt_len']} tokens, "
      f"{llama['results'][0]['decode_steps']} decode steps, best of the repeats")
print(f"load average (1/5/15 min) before pagedserve: {load_ours}; before llama.cpp: {load_llama}")
print(f"{'phase':8}{'batch':>6}{'pagedserve tok/s':>18}{'llama.cpp tok/s':>17}{'ratio':>8}")
rows = []
for phase in ("prefill", "decode"):
    for batch in sorted({b for p, b in ours if p == phase}):
        a, b = ours.get((phase, batch)), theirs.get((phase, batch))
        ratio = a / b if a and b else float("nan")
        rows.append({"phase": phase, "batch": batch, "pagedserve_tokens_per_s": round(a, 1),
                     "llamacpp_tokens_per_s": b, "ratio": round(ratio, 3)})
        print(f"{phase:8}{batch:>6}{a:>18.1f}{b:>17.1f}{ratio:>7.2f}x")
json.dump({"rows": rows, "load_before_pagedserve": load_ours, "load_before_llamacpp": load_llama,
           "threads": int(threads)}, open(f"{out}/side_by_side.json", "w"), indent=1)
print(f"(JSON: {out}/pagedserve.json, {out}/llamacpp.json, {out}/side_by_side.json)")
PY
