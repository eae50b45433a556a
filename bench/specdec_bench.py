#!/usr/bin/env python3
"""Speculative decoding at batch 1 (issue 33): `pagedserve generate` on the
committed input-grounded prompts (bench/specdec_prompts.json: rename a
variable, fix typos, quote-heavy summaries, copy code), greedy, with and
without --speculative-config, sides interleaved per prompt and round.

    bench/specdec_bench.py [--bin build/runtime/cli/pagedserve] [--model GGUF]
        [--spec '{"method": "ngram", "num_speculative_tokens": 4, ...}'
                | '{"model": DRAFT, "num_speculative_tokens": 4}']
        [--max-tokens 128] [--rounds 2] [--threads 2] [--limit N] [--json-out FILE]

Per side it reports output tokens / generation seconds summed over the
prompts (the `generate` line: time from the request's admission to its end,
prefill included, model loading excluded), the ratio, and how many prompts
gave the same text with and without speculation (greedy; on the quantized
path a verification step multiplies k + 1 rows at once, which is not
bit-identical to one row, so a near tie may flip: docs/coordinator.md).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LINE = re.compile(r"completion_tokens=(\d+) .*time=([0-9.]+)s")
SPEC = re.compile(r"draft_tokens=(\d+) accepted=(\d+)")


def run(binary, model, prompt, max_tokens, spec, threads):
    cmd = [binary, "generate", "--model", model, "--chat", "--temperature", "0",
           "--max-tokens", str(max_tokens), "--prompt", prompt, "--log-level", "warning"]
    if spec:
        cmd += ["--speculative-config", spec]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd[:6])} ...\n{p.stderr}")
    m = LINE.search(p.stderr)
    if not m:
        sys.exit(f"no timing line in:\n{p.stderr}")
    sm = SPEC.search(p.stderr)
    drafted, accepted = (int(sm.group(1)), int(sm.group(2))) if sm else (0, 0)
    return p.stdout, int(m.group(1)), float(m.group(2)), drafted, accepted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/runtime/cli/pagedserve"))
    ap.add_argument("--model")
    ap.add_argument("--spec", default='{"method": "ngram", "num_speculative_tokens": 4, '
                    '"prompt_lookup_max": 4, "prompt_lookup_min": 2}')
    ap.add_argument("--prompts", default=os.path.join(HERE, "specdec_prompts.json"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    model = a.model or subprocess.run([os.path.join(ROOT, "scripts/fetch-model")], check=True,
                                      capture_output=True, text=True).stdout.strip()
    prompts = json.load(open(a.prompts))["prompts"]
    if a.limit:
        prompts = prompts[:a.limit]
    sides = {"plain": "", "spec": a.spec}
    totals = {s: [0, 0.0] for s in sides}
    drafted = accepted = 0
    same = 0
    loads = []
    for r in range(a.rounds):
        for i, p in enumerate(prompts):
            texts = {}
            order = list(sides) if (r + i) % 2 == 0 else list(reversed(list(sides)))
            for side in order:
                loads.append(os.getloadavg()[0])
                text, toks, secs, d, acc = run(a.bin, model, p["prompt"], a.max_tokens, sides[side],
                                               a.threads)
                drafted += d
                accepted += acc
                texts[side] = text
                totals[side][0] += toks
                totals[side][1] += secs
            same += texts["plain"] == texts["spec"]
            print(f"round {r} prompt {i:2d} ({p['kind']}): same text {texts['plain'] == texts['spec']}",
                  flush=True)
    res = {s: {"tokens": t, "seconds": round(sec, 3), "tokens_per_s": round(t / sec, 2)}
           for s, (t, sec) in totals.items()}
    res["speedup"] = round(res["spec"]["tokens_per_s"] / res["plain"]["tokens_per_s"], 3)
    res["acceptance"] = f"{accepted}/{drafted}"
    res["same_text"] = f"{same}/{a.rounds * len(prompts)}"
    res["spec_config"] = a.spec
    res["load_avg_1m"] = {"min": min(loads), "max": max(loads)}
    print(json.dumps(res, indent=1))
    if a.json_out:
        json.dump(res, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
