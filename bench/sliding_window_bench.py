#!/usr/bin/env python3
"""Sliding-window benchmark (issue 30): decode speed and KV blocks held by one
long sequence, at several context lengths, with a model whose every layer
attends to the last W positions against the same model without a window.

    bench/sliding_window_bench.py --model WINDOWED.gguf --baseline FULL.gguf
        [--contexts 2048,8192,16384] [--output-len 64] [--repeats 2] [--threads 2]
        [--pagedserve-bin PATH] [--serve-arg=--kv-cache-memory=... ...] [--json-out FILE]

Make the two files with bench/make_random_gguf.py (same seed, so the same
weights; only the `llama.attention.sliding_window` key differs):

    bench/make_random_gguf.py swa4k.gguf --shape 135m --context-length 32768 --sliding-window 4096
    bench/make_random_gguf.py full.gguf  --shape 135m --context-length 32768

Method. For each model (interleaved, --repeats times, a fresh server each
time: `pagedserve serve` with OMP/OpenBLAS threads = --threads and
--max-model-len = the longest context + output + 16) and each context length
N: one streamed /v1/completions request whose prompt is N random token ids
(seeded; the same for both models), max_tokens --output-len, greedy,
ignore_eos. Decode speed = (output tokens - 1) / (latency - TTFT), i.e.
1 / TPOT of that one sequence; TTFT is the prefill of N tokens. KV blocks held:
/metrics pagedserve_kv_cache_usage_ratio{pool="device"} polled every 0.05 s
during the request, the largest value times the pool's block count (from the
server's start-up line "KV blocks N x B tokens"). The 1-minute load average is
recorded before each request. Prefix caching is off (--no-enable-prefix-caching)
so that each request computes its prompt.
"""

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_bench import (OpenAIBackend, Record, Request, RunningSampler, Server,  # noqa: E402
                           default_pagedserve_bin, free_port, thread_env)


class UsageSampler(RunningSampler):
    """Polls the device KV cache usage ratio; max_ratio = the largest seen."""

    def __init__(self, backend: OpenAIBackend, interval: float = 0.05):
        super().__init__(backend, interval)
        self.max_ratio = 0.0

    def _loop(self) -> None:
        pattern = re.compile(rb"^pagedserve_kv_cache_usage_ratio\{[^}]*pool=\"device\"[^}]*\} ([0-9.e+-]+)$", re.M)
        while not self._stop.is_set():
            try:
                status, body = self.backend.get("/metrics")
                m = pattern.search(body) if status == 200 else None
                if m:
                    self.max_ratio = max(self.max_ratio, float(m.group(1)))
            except OSError:
                pass
            self._stop.wait(self.interval)


def pool_blocks(server: Server, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"KV blocks (\d+) x", server.tail())
        if m:
            return int(m.group(1))
        time.sleep(0.2)
    raise SystemExit(f"sliding_window_bench: no 'KV blocks N x' line in {server.log_path}")


def run_model(args, path: str, tag: str, prompts: Dict[int, List[int]], log_dir: str) -> Dict:
    port = free_port()
    max_len = max(args.contexts) + args.output_len + 16
    cmd = [args.pagedserve_bin, "serve", "--model", path, "--host", "127.0.0.1", "--port", str(port),
           "--zmq-endpoint", f"tcp://127.0.0.1:{free_port()}", "--disable-log-requests",
           "--no-enable-prefix-caching", "--max-model-len", str(max_len)] + args.serve_arg
    server = Server(f"pagedserve-{tag}", cmd, thread_env(args.threads, "default"), log_dir)
    try:
        backend = OpenAIBackend("pagedserve", f"http://127.0.0.1:{port}", timeout=args.request_timeout)
        server.wait_healthy(backend, 120)
        blocks = pool_blocks(server)
        out = {"model": path, "pool_blocks": blocks, "contexts": {}}
        for n in args.contexts:
            load = round(os.getloadavg()[0], 2)
            rec = Record()
            with UsageSampler(backend) as usage:
                backend.send(Request(index=0, prompt=prompts[n], prompt_len=n, output_len=args.output_len,
                                     arrival=0.0), rec)
            if not rec.ok:
                raise SystemExit(f"sliding_window_bench: {tag} at {n}: {rec.error}")
            decode = (rec.output_tokens - 1) / (rec.latency - rec.ttft)
            out["contexts"][n] = {"load_1m_before": load, "ttft_s": round(rec.ttft, 3),
                                  "decode_tokens_per_s": round(decode, 2),
                                  "max_kv_usage": usage.max_ratio,
                                  "max_blocks_held": round(usage.max_ratio * blocks)}
            print(f"sliding_window_bench: {tag} N={n}: decode {decode:.1f} tok/s, TTFT {rec.ttft:.2f} s, "
                  f"blocks held {round(usage.max_ratio * blocks)} / {blocks} (load {load})", file=sys.stderr)
        return out
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the windowed GGUF")
    ap.add_argument("--baseline", required=True, help="the same model without a window")
    ap.add_argument("--contexts", default="2048,8192,16384")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=1800.0)
    ap.add_argument("--pagedserve-bin", default=default_pagedserve_bin())
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--json-out")
    args = ap.parse_args()
    args.contexts = [int(x) for x in args.contexts.split(",")]
    rng = random.Random(args.seed)
    # Ids of ordinary tokens (the SmolLM2 vocabulary's specials are below 17).
    prompts = {n: [rng.randrange(100, 49000) for _ in range(n)] for n in args.contexts}
    log_dir = tempfile.mkdtemp(prefix="sliding_window_bench.")
    runs = []
    try:
        for rep in range(args.repeats):
            for tag, path in (("window", args.model), ("full", args.baseline)):
                r = run_model(args, path, tag, prompts, log_dir)
                r.update(tag=tag, repeat=rep)
                runs.append(r)
    finally:
        Server.stop_all()
    print("| context | window: decode tok/s | full: decode tok/s | window / full | "
          "window: blocks held | full: blocks held |")
    print("|---|---|---|---|---|---|")
    for n in args.contexts:
        def cell(tag: str, key: str) -> List[float]:
            return [r["contexts"][n][key] for r in runs if r["tag"] == tag]
        w, f = cell("window", "decode_tokens_per_s"), cell("full", "decode_tokens_per_s")
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        print(f"| {n} | {' / '.join(f'{x:.1f}' for x in w)} | {' / '.join(f'{x:.1f}' for x in f)} | "
              f"{mean(w) / mean(f):.2f}x | {max(cell('window', 'max_blocks_held'))} | "
              f"{max(cell('full', 'max_blocks_held'))} |")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"runs": runs, "log_dir": log_dir}, fh, indent=1)


if __name__ == "__main__":
    main()
