#!/usr/bin/env python3
"""Figures for scripts/gpu-check's summary.json, read from a step's output.

    gpu_check_figures.py gtest FILE.xml      tests / failures / skipped / seconds
    gpu_check_figures.py attention FILE.json paged_attention_cuda_bench --json
    gpu_check_figures.py model FILE.json     bench_model --benchmark_format=json
    gpu_check_figures.py sdpa FILE.json      bench/sdpa_baseline.py --json

Prints one JSON object on stdout; {} when the file is missing or unreadable
(the reason goes to stderr). Standard library only.
"""

import json
import statistics
import sys
import xml.etree.ElementTree as ET


def gtest(path):
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    return {
        "tests": int(root.get("tests", len(cases))),
        "failures": int(root.get("failures", 0)),
        "errors": int(root.get("errors", 0)),
        # GoogleTest marks a skipped case with result="skipped" and a <skipped> child.
        "skipped": sum(1 for c in cases if c.get("result") == "skipped" or c.find("skipped") is not None),
        "disabled": int(root.get("disabled", 0)),
        "seconds": float(root.get("time", 0)),
    }


def attention(path):
    with open(path) as f:
        d = json.load(f)
    if "skipped" in d:
        return {"skipped": d["skipped"]}
    rows = d.get("results", [])
    out = {"device": d.get("device"), "copy_bandwidth_GBps": round(d.get("copy_bandwidth_GBps", 0), 1),
           "shapes": len(rows)}
    if d.get("partial"):
        out["partial"] = True  # the run was cut off: the shapes it finished

    def pick(heads, kv_heads, dtype, batch, context):
        for r in rows:
            if (r["heads"], r["kv_heads"], r["dtype"], r["batch"], r["context"]) == (
                    heads, kv_heads, dtype, batch, context):
                return {"pct_of_copy_bw": r["pct_of_copy_bw"], "kv_GBps": r["kv_GBps"],
                        "paged_ms": r["paged_ms"], "variant": r["variant"],
                        # the tensor-core GQA kernel (off by default), -1 if not run
                        "gqa_mma_pct_of_copy_bw": r.get("gqa_mma_pct_of_copy_bw", -1)}
        return None

    # The headline shape, and the same shape as MHA.
    out["gqa_32q8kv_bf16_b64_ctx4096"] = pick(32, 8, "bf16", 64, 4096)
    out["mha_32q32kv_bf16_b64_ctx4096"] = pick(32, 32, "bf16", 64, 4096)
    for kind in ("MHA", "GQA"):
        pcts = [r["pct_of_copy_bw"] for r in rows if r.get("attention") == kind]
        if pcts:
            out[kind] = {"pct_of_copy_bw_min": round(min(pcts), 1),
                         "pct_of_copy_bw_median": round(statistics.median(pcts), 1),
                         "pct_of_copy_bw_max": round(max(pcts), 1)}
    # Prefill attention: the tensor-core kernel (off by default) against the SIMT one.
    prefill = d.get("prefill", [])
    if prefill:
        out["prefill"] = [{k: r[k] for k in ("dtype", "prompt", "simt_tflops", "mma_tflops", "mma_speedup")}
                          for r in prefill]
    return out


def model(path):
    with open(path) as f:
        d = json.load(f)
    ctx = d.get("context", {})
    out = {"model": ctx.get("model"), "device": ctx.get("device"),
           "kv_cache_dtype": ctx.get("kv_cache_dtype"), "decode_steps": ctx.get("decode_steps"),
           "prompt_len": ctx.get("prompt_len"), "decode": {}}
    for b in d.get("benchmarks", []):
        name = b.get("name", "")
        if not name.startswith("decode/batch:"):
            continue
        batch = name.split(":", 1)[1].split("/", 1)[0]
        out["layers"] = int(b.get("layers", 0))
        out["decode"][f"batch_{batch}"] = {
            "tokens_per_s": round(b.get("tokens_per_s", 0), 1),
            "tokens_per_s_best": round(b.get("tokens_per_s_best", 0), 1),
            # tokens/s x layers: one layer's rate if the whole step were layers.
            "layer_tokens_per_s": round(b.get("layer_tokens_per_s", 0), 1),
        }
        if "graph_mib" in b:  # CUDA graphs held after this batch's run (cumulative)
            out["decode"][f"batch_{batch}"]["graph_mib"] = round(b["graph_mib"], 1)
    return out


def sdpa(path):
    with open(path) as f:
        d = json.load(f)
    if "skipped" in d:
        return {"skipped": d["skipped"]}
    rows = d.get("results", [])
    out = {"device": d.get("device"), "torch": d.get("torch"), "shapes": len(rows)}
    for r in rows:
        if (r["heads"], r["kv_heads"], r["batch"], r["context"]) == (32, 8, 64, 4096):
            out["gqa_32q8kv_f16_b64_ctx4096"] = {"sdpa_ms": r["sdpa_ms"], "kv_GBps": round(r["kv_GBps"], 1)}
    return out


def main():
    kinds = {"gtest": gtest, "attention": attention, "model": model, "sdpa": sdpa}
    if len(sys.argv) != 3 or sys.argv[1] not in kinds:
        sys.exit(__doc__)
    kind, path = sys.argv[1], sys.argv[2]
    try:
        fig = kinds[kind](path)
    except (OSError, ValueError, KeyError, ET.ParseError) as e:
        print(f"gpu_check_figures: {kind} {path}: {e}", file=sys.stderr)
        fig = {}
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
