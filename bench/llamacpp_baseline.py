#!/usr/bin/env python3
"""llama.cpp baseline for the model benchmarks (issue 3): prefill and decode
throughput on the SmolLM2 GGUF at batch 1, 8 and 32, through llama-cpp-python's
low-level C API bindings (no llama.cpp command-line tool is needed).

    python3 bench/llamacpp_baseline.py [--gguf PATH] [--threads 2] [--batches 1,8,32]
                                       [--prompt-len 128] [--decode-steps 32] [--repeats 3]

Method, per batch size B (one llama_context with n_seq_max = B and a unified KV
cache, fresh for each B):
  * prefill: B sequences of --prompt-len tokens each are submitted through
    llama_decode in llama_batch chunks of at most n_batch (512) tokens, sequences
    packed one after another, logits requested only for each sequence's last
    token. prefill tokens/s = B * prompt_len / wall time of those calls.
  * decode: then --decode-steps steps, each one llama_batch holding one token per
    sequence (B tokens, all with logits) at the next position.
    decode tokens/s = B * decode_steps / wall time of those steps.
    Decode tokens are fixed ids (greedy sampling is not timed), so the figure is
    the forward pass only, as for our own engine's decode benchmark.
  * each measurement is repeated --repeats times after clearing the KV cache; the
    best (highest) figure is reported, plus all samples.
The prompt tokens are the tokenization of a fixed English text, repeated to the
requested length. Prints one JSON object on stdout.
"""

import argparse
import ctypes
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time

import llama_cpp as L

TEXT = ("The history of the lighthouse is, in many ways, the history of coastal trade. "
        "Long before electric lamps and rotating lenses, sailors relied on bonfires lit on "
        "hilltops to mark dangerous rocks and the entrances of harbours. ")
N_BATCH = 512


def default_gguf():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.check_output([os.path.join(root, "scripts", "fetch-model")],
                                   text=True).strip()


def tokenize(vocab, text):
    raw = text.encode("utf-8")
    buf = (L.llama_token * (len(raw) + 16))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)
    if n < 0:
        raise RuntimeError("llama_tokenize failed")
    return list(buf[:n])


def fill(batch, entries):
    """entries: list of (token, pos, seq_id, want_logits)."""
    for i, (tok, pos, seq, logits) in enumerate(entries):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if logits else 0
    batch.n_tokens = len(entries)


def decode(ctx, batch):
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def run_batch_size(model, vocab, prompt, B, args):
    P, G = len(prompt), args.decode_steps
    cparams = L.llama_context_default_params()
    n_ctx = B * (P + G)
    cparams.n_ctx = ((n_ctx + 255) // 256) * 256
    cparams.n_batch = N_BATCH
    cparams.n_ubatch = N_BATCH
    cparams.n_seq_max = B
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    cparams.kv_unified = True
    cparams.no_perf = True
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError(f"llama_init_from_model failed for batch {B}")
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(max(N_BATCH, B), 0, B)

    prefill_entries = [(prompt[p], p, s, p == P - 1) for s in range(B) for p in range(P)]

    def prefill():
        for i in range(0, len(prefill_entries), N_BATCH):
            fill(batch, prefill_entries[i:i + N_BATCH])
            decode(ctx, batch)
        L.llama_synchronize(ctx)

    def decode_steps():
        for g in range(G):
            tok = prompt[g % P]
            fill(batch, [(tok, P + g, s, True) for s in range(B)])
            decode(ctx, batch)
        L.llama_synchronize(ctx)

    # Warm-up (page in weights, size buffers).
    fill(batch, [(prompt[0], 0, 0, True)])
    decode(ctx, batch)
    L.llama_memory_clear(mem, True)

    pre, dec = [], []
    for _ in range(args.repeats):
        L.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        prefill()
        t1 = time.perf_counter()
        decode_steps()
        t2 = time.perf_counter()
        pre.append(B * P / (t1 - t0))
        dec.append(B * G / (t2 - t1))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    return {"batch": B, "prompt_len": P, "decode_steps": G,
            "prefill_tokens_per_s": round(max(pre), 1),
            "decode_tokens_per_s": round(max(dec), 1),
            "prefill_samples": [round(x, 1) for x in pre],
            "decode_samples": [round(x, 1) for x in dec]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extra-bufts", action="store_true",
                    help="let llama.cpp use extra buffer types (AMX, repacking)")
    args = ap.parse_args()
    gguf = args.gguf or default_gguf()

    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user: None)  # kept alive below
    L.llama_log_set(quiet, ctypes.c_void_p())
    mparams = L.llama_model_default_params()
    # No extra buffer types (AMX tiles, repacked weights): AMX faults with
    # "Illegal instruction" on this virtualised Xeon, and Q4_1 has no repacked kernel.
    mparams.use_extra_bufts = args.extra_bufts
    model = L.llama_model_load_from_file(gguf.encode(), mparams)
    if not model:
        sys.exit(f"llamacpp_baseline: cannot load {gguf}")
    vocab = L.llama_model_get_vocab(model)
    prompt = tokenize(vocab, TEXT)
    while len(prompt) < args.prompt_len:
        prompt = prompt + prompt
    prompt = prompt[:args.prompt_len]

    load_before = os.getloadavg()[0]  # other processes competing for the cores
    results = [run_batch_size(model, vocab, prompt, int(b), args)
               for b in args.batches.split(",")]
    L.llama_model_free(model)
    sysinfo = L.llama_print_system_info()
    print(json.dumps({
        "engine": "llama.cpp via llama-cpp-python " + importlib.metadata.version("llama-cpp-python"),
        "model": os.path.basename(gguf),
        "n_threads": args.threads,
        "use_extra_bufts": args.extra_bufts,
        "cpu": platform.processor() or platform.machine(),
        "load_average_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "llama_system_info": sysinfo.decode() if isinstance(sysinfo, bytes) else str(sysinfo),
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
