#!/usr/bin/env python3
"""PyTorch SDPA decode baseline over contiguous KV (side by side with
paged_attention_cuda_bench; run by scripts/gpu-check where torch has CUDA).

Same shapes as the CUDA benchmark: batch 8/32/64, context 1K/4K/16K, heads
32q/8kv and 64q/8kv, head size 128, fp16, one query token per sequence.
K/V are contiguous [batch, kv_heads, context, head]; GQA is expressed with
enable_gqa=True where this torch has it, else by repeating K/V heads beforehand
(outside the timed region). Reports median CUDA-event time and KV bytes/s.

    python3 bench/sdpa_baseline.py [--json PATH] [--quick]
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--quick", action="store_true", help="skip 16K contexts for batch > 8")
    args = ap.parse_args()

    def skip(reason: str) -> int:
        print(f"sdpa_baseline: skipped ({reason})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"skipped": reason}, f)
        return 0

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:  # pragma: no cover - depends on the machine
        return skip(f"torch not importable: {e}")
    if not torch.cuda.is_available():
        return skip("torch has no CUDA device")

    dev = torch.device("cuda")
    results = []
    head, kv_heads = 128, 8
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'batch':<6} {'context':<8} {'heads':<7} {'ms':<9} {'KV GB/s':<9} gqa")
    for heads in (32, 64):
        for batch in (8, 32, 64):
            for ctx in (1024, 4096, 16384):
                if args.quick and ctx == 16384 and batch != 8:
                    continue
                q = torch.randn(batch, heads, 1, head, device=dev, dtype=torch.float16)
                k = torch.randn(batch, kv_heads, ctx, head, device=dev, dtype=torch.float16)
                v = torch.randn(batch, kv_heads, ctx, head, device=dev, dtype=torch.float16)
                gqa = "enable_gqa"
                try:
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
                except TypeError:
                    gqa = "repeat_interleave (untimed)"
                    kr = k.repeat_interleave(heads // kv_heads, dim=1)
                    vr = v.repeat_interleave(heads // kv_heads, dim=1)
                    fn = lambda: F.scaled_dot_product_attention(q, kr, vr)  # noqa: E731
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                times = []
                for _ in range(20):
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fn()
                    e1.record()
                    e1.synchronize()
                    times.append(e0.elapsed_time(e1))
                times.sort()
                ms = times[len(times) // 2]
                kv_bytes = 2 * batch * ctx * kv_heads * head * 2
                gbps = kv_bytes / (ms * 1e-3) / 1e9
                print(f"{batch:<6} {ctx:<8} {heads:>2}/{kv_heads:<4} {ms:<9.4f} {gbps:<9.1f} {gqa}")
                results.append({"batch": batch, "context": ctx, "heads": heads,
                                "kv_heads": kv_heads, "head_size": head, "dtype": "f16",
                                "sdpa_ms": ms, "kv_GBps": gbps, "gqa": gqa})
                del q, k, v
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
