#!/usr/bin/env bash
# pagedserve's bench_model next to llama.cpp's own tools (llama-bench,
# llama-batched-bench) on the same GGUF, thread count and shapes, in rounds
# interleaved A/B/A/B with the load average recorded before each side.
# Prints one table (best figure over the rounds per cell, and every round's
# figures) and writes JSON files. Not run by CI.
#
#   bench/model_vs_llamacpp.sh [--build-dir build-bench] [--gguf PATH] [--threads 2]
#       [--batches 1,8,32] [--prompt-len 128] [--decode-steps 32] [--rounds 2]
#       [--llamacpp-bin DIR] [--out-dir DIR] [--omp-wait-policy default|passive|active]
#       [--llamacpp-no-repack] [-- extra bench_model flags]
#
# With -- --read_bandwidth_mib=N, bench_model also measures the machine's read
# bandwidth (an N MiB buffer, same threads) and the table ends with batch-1
# decode's fraction of the bandwidth limit (file bytes per token; issue 34).
#
# --llamacpp-no-repack runs llama.cpp without its repacked / AMX weight buffers
# (llama-bench --repack 0, llama-batched-bench --no-repack): on a CPU that exposes
# AMX, llama.cpp's AMX path crashed on a Q4_K_M file (issue 34, 2026-12-05).
#
# Both sides use OpenMP (llama.cpp's default build has GGML_OPENMP) and get the
# same OMP_WAIT_POLICY: "default" (the default) leaves it unset (libgomp spins
# ~3 ms before sleeping, as a deployment runs), "passive" sleeps at once (for a
# shared, oversubscribed machine, where spinning threads slow everything down).
#
# llama.cpp: bench/build-llamacpp builds it (default --llamacpp-bin is its output).
#   llama-bench          pp<prompt-len> and tg<decode-steps> at batch 1 (its defaults
#                        otherwise; -r 3 repetitions, mean reported)
#   llama-batched-bench  -npp <prompt-len> -ntg <decode-steps> -npl <batches>, n_batch 512:
#                        S_PP = B*PP/T_PP (prefill) and S_TG = B*TG/T_TG (decode)
# pagedserve: bench_model (see its header for the method; best of --repeats 2).
# Our build: cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release
#   -DPAGEDSERVE_CUDA=OFF -DPAGEDSERVE_BUILD_TESTS=OFF && cmake --build build-bench --target bench_model
# (no -march=native: our SIMD paths are chosen at run time; llama.cpp builds native).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=build-bench gguf="" threads=2 batches=1,8,32 prompt_len=128 decode_steps=32 rounds=2
llbin="" out="" extra=() wait_policy=default bench_flags=() batched_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --gguf) gguf=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --prompt-len) prompt_len=$2; shift 2 ;;
    --decode-steps) decode_steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --llamacpp-bin) llbin=$2; shift 2 ;;
    --out-dir) out=$2; shift 2 ;;
    --omp-wait-policy) wait_policy=$2; shift 2 ;;
    --llamacpp-no-repack) bench_flags=(--repack 0); batched_flags=(--no-repack); shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "model_vs_llamacpp: unknown option '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$root/$build" ;; esac
bin="$build/bench/bench_model"
[ -x "$bin" ] || { echo "model_vs_llamacpp: $bin not built (see --help)" >&2; exit 2; }
[ -n "$gguf" ] || gguf=$("$root/scripts/fetch-model")
[ -n "$llbin" ] || llbin=$("$root/bench/build-llamacpp")
[ -n "$out" ] || out=$(mktemp -d -t model_vs_llamacpp.XXXXXX)
mkdir -p "$out"
unset OMP_WAIT_POLICY GOMP_SPINCOUNT
case "$wait_policy" in
  default) ;;
  passive|active) export OMP_WAIT_POLICY=${wait_policy^^} ;;
  *) echo "model_vs_llamacpp: --omp-wait-policy must be default, passive or active" >&2; exit 2 ;;
esac
load() { cut -d' ' -f1-3 /proc/loadavg; }
max_b=$(tr ',' '\n' <<<"$batches" | sort -n | tail -1)
ctx=$(( max_b * (prompt_len + decode_steps) + 64 ))

for r in $(seq 1 "$rounds"); do
  echo "round $r: pagedserve, load $(load)" >&2
  load > "$out/load_ours_$r"
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1 "$bin" --model="$gguf" --batches="$batches" \
    --prompt_len="$prompt_len" --decode_steps="$decode_steps" --repeats=2 \
    --benchmark_out="$out/pagedserve_$r.json" --benchmark_out_format=json "${extra[@]}" >&2
  echo "round $r: llama.cpp, load $(load)" >&2
  load > "$out/load_llama_$r"
  "$llbin/llama-bench" -m "$gguf" -t "$threads" -p "$prompt_len" -n "$decode_steps" -r 3 -o json \
    "${bench_flags[@]}" \
    > "$out/llama_bench_$r.json" 2>"$out/llama_bench_$r.log"
  "$llbin/llama-batched-bench" -m "$gguf" -t "$threads" -c "$ctx" -b 512 -ub 512 \
    -npp "$prompt_len" -ntg "$decode_steps" -npl "$batches" --output-format jsonl \
    "${batched_flags[@]}" \
    > "$out/llama_batched_$r.jsonl" 2>&1  # result lines are the ones starting with {
done

python3 - "$out" "$rounds" "$threads" "$gguf" "$wait_policy" <<'PY'
import json, os, re, sys
out, rounds, threads, gguf, wait_policy = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
ours, theirs = {}, {}
def add(d, k, v): d.setdefault(k, []).append(v)
for r in range(1, rounds + 1):
    for b in json.load(open(f"{out}/pagedserve_{r}.json"))["benchmarks"]:
        m = re.match(r"(prefill|decode)/batch:(\d+)", b["name"])
        if m: add(ours, (m.group(1), int(m.group(2))), b["tokens_per_s_best"])
        if b["name"].startswith("read_bandwidth"): add(ours, ("read_bandwidth", 0), b["bytes_per_s_best"])
    for t in json.load(open(f"{out}/llama_bench_{r}.json")):
        if t["n_prompt"] > 0 and t["n_gen"] == 0: add(theirs, ("llama-bench pp", 1), t["avg_ts"])
        if t["n_gen"] > 0 and t["n_prompt"] == 0: add(theirs, ("llama-bench tg", 1), t["avg_ts"])
    for line in open(f"{out}/llama_batched_{r}.jsonl"):
        line = line.strip()
        if not line.startswith("{"): continue
        j = json.loads(line)
        add(theirs, ("prefill", j["pl"]), j["speed_pp"])
        add(theirs, ("decode", j["pl"]), j["speed_tg"])
loads = [(open(f"{out}/load_ours_{r}").read().strip(), open(f"{out}/load_llama_{r}").read().strip())
         for r in range(1, rounds + 1)]
print(f"model {os.path.basename(gguf)}, {threads} threads, OMP_WAIT_POLICY {wait_policy}; "
      f"best over {rounds} interleaved rounds")
for i, (a, b) in enumerate(loads, 1):
    print(f"round {i}: load before pagedserve {a}; before llama.cpp {b}")
rows = []
print(f"{'phase':8}{'batch':>6}{'pagedserve':>12}{'llama.cpp':>11}  {'baseline':22}{'ratio':>7}   rounds (ours | theirs)")
for phase in ("prefill", "decode"):
    for batch in sorted({b for p, b in ours if p == phase}):
        refs = [((phase, batch), "llama-batched-bench")]
        if batch == 1:
            refs.insert(0, (("llama-bench " + ("pp" if phase == "prefill" else "tg"), 1), "llama-bench"))
        for key, name in refs:
            a, b = ours.get((phase, batch)), theirs.get(key)
            if not a or not b: continue
            ratio = max(a) / max(b)
            rows.append({"phase": phase, "batch": batch, "baseline": name, "pagedserve": a,
                         "llamacpp": b, "ratio_best": round(ratio, 3)})
            print(f"{phase:8}{batch:>6}{max(a):>12.1f}{max(b):>11.1f}  {name:22}{ratio:>6.2f}x   "
                  f"{', '.join(f'{x:.1f}' for x in a)} | {', '.join(f'{x:.1f}' for x in b)}")
# Batch-1 decode reads every weight once per token: tokens/s x file bytes over
# the read bandwidth bench_model measured (-- --read_bandwidth_mib=N).
bw = max(ours.get(("read_bandwidth", 0), [0]))
if bw > 0:
    size = os.path.getsize(gguf)
    print(f"read bandwidth {bw / 1e9:.2f} GB/s (best of {len(ours[('read_bandwidth', 0)])}); "
          f"file {size / 1e9:.3f} GB: bandwidth limit {bw / size:.2f} tokens/s")
    for name, key in (("pagedserve decode b1", ("decode", 1)),
                      ("llama-bench tg", ("llama-bench tg", 1)),
                      ("llama-batched-bench b1", ("decode", 1))):
        src = ours if name.startswith("pagedserve") else theirs
        if src.get(key):
            print(f"  {name:24} {max(src[key]):7.2f} tokens/s = {max(src[key]) * size / bw:.1%} of it")
json.dump({"rows": rows, "loads": loads, "threads": int(threads)},
          open(f"{out}/side_by_side.json", "w"), indent=1)
print(f"(JSON: {out}/side_by_side.json)")
PY
