#!/usr/bin/env python3
"""Markdown tables from bench_linear JSON outputs (two interleaved runs).

Usage: bench/linear_bench_table.py [--cpu] run1.json run2.json [method.json]
Prints, per (shape, tokens): the fp32 OpenBLAS baseline's time in each run and
each format's speedup over it in each run (same run, same load). Wall time by
default; --cpu uses the main thread's CPU time (meaningful for one thread on a
shared machine, where wall time includes time spent waiting for a core).
"""
import json
import sys

NAMES = {0: "F32", 1: "F16", 30: "BF16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1",
         8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
ORDER = [0, 1, 30, 8, 2, 3, 6, 7, 12, 13, 14]


KEY = "real_time"


def load(path):
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        parts = b["name"].split("/")
        if parts[-1] == "real_time":
            parts = parts[:-1]
        out[(parts[0], tuple(int(p) for p in parts[1:]))] = b[KEY]
    return out


def main():
    global KEY
    args = sys.argv[1:]
    if args and args[0] == "--cpu":
        KEY = "cpu_time"
        args = args[1:]
    runs = [load(p) for p in args[0:2]]
    shapes = sorted({k[1] for k in runs[0] if k[0] == "BM_OpenBlasF32"},
                    key=lambda s: (s[0] * s[1], s[2]))
    head = ["rows x cols", "tokens", "OpenBLAS fp32 (us)"] + [NAMES[f] for f in ORDER]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for rows, cols, tok in shapes:
        base = [r.get(("BM_OpenBlasF32", (rows, cols, tok))) for r in runs]
        cells = [f"{rows}x{cols}", str(tok), " / ".join(f"{b:.0f}" for b in base)]
        for f in ORDER:
            t = [r.get(("BM_Linear", (f, rows, cols, tok))) for r in runs]
            if any(v is None for v in t):
                cells.append("-")
            else:
                cells.append(" / ".join(f"{b / v:.1f}" for b, v in zip(base, t)))
        print("| " + " | ".join(cells) + " |")
    if len(args) > 2:
        m = load(args[2])
        print()
        m = {k: v for k, v in m.items() if k[0] == "BM_LinearMethod"}
        toks = sorted({k[1][3] for k in m})
        fmts = [f for f in ORDER if any(k[1][0] == f for k in m)]
        print("| format | " + " | ".join(f"{t} tok" for t in toks) + " |")
        print("|" + "---|" * (len(toks) + 1))
        for f in fmts:
            cells = [NAMES[f]]
            for t in toks:
                a = m.get(("BM_LinearMethod", (f, 1536, 1536, t, 0)))
                b = m.get(("BM_LinearMethod", (f, 1536, 1536, t, 1)))
                c = m.get(("BM_LinearMethod", (f, 1536, 1536, t, 2)))  # row_block
                if a and b and c:
                    cells.append(f"{a / 1000:.2f} / {c / 1000:.2f} / {b / 1000:.2f}")
                else:
                    cells.append(f"{a / 1000:.1f} / {b / 1000:.1f}" if a and b else "-")
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
