#!/usr/bin/env python3
"""Writes a random-weight Llama as an F16 GGUF file, for benchmarks of model
shapes larger than the default SmolLM2-135M (issue 10: "a random-weight Llama
of about 1B parameters ... quantized to Q4_K_M with llama.cpp's llama-quantize").

    python3 bench/make_random_gguf.py OUT.gguf [--shape 1b|3b|135m|qwen3moe-2l] [--seed 0]
        [--tokenizer-from SOURCE.gguf] [--context-length 8192] [--sliding-window N]

--sliding-window N writes {arch}.attention.sliding_window = N (every layer
attends to the last N positions, as Mistral v0.1; bench/sliding_window_bench.py).

Then quantize it with the baseline build (bench/build-llamacpp):

    $(bench/build-llamacpp | tail -1)/llama-quantize OUT.gguf OUT-Q4_K_M.gguf Q4_K_M

Shapes (hidden, layers, heads, KV heads, FFN; vocabulary 49152 from the
tokenizer source, embeddings tied as in Llama-3.2-1B):
  135m: SmolLM2-135M's own shape (576, 30, 9, 3, 1536)
  1b:   Llama-3.2-1B's shape with a 49152 vocabulary (2048, 16, 32, 8, 8192), ~1.07e9
  3b:   Llama-3.2-3B's shape with a 49152 vocabulary (3072, 28, 24, 8, 8192), ~3.0e9
  8b:   Llama-3.1-8B's shape with a 49152 vocabulary (4096, 32, 32, 8, 14336), ~7.2e9
        (Llama-3.1-8B has 128256 tokens and an untied LM head: 0.5e9 more
        parameters read per token than here); the F16 file is ~14.5 GB
  qwen3moe-2l: 2 of Qwen3-30B-A3B's 48 layers (GGUF arch qwen3moe: hidden 2048,
        32 heads and 4 KV heads of 128 with q/k norms, 128 experts of width 768,
        top-8), a 49152 vocabulary, untied LM head; ~1.4e9 parameters of which
        ~0.35e9 active per token (the per-layer work of the 30B model; the
        whole model does not fit this machine's time budget to generate)

The tokenizer (vocabulary, merges, token types, special ids, pre-tokenizer)
is copied from --tokenizer-from (default: the model scripts/fetch-model
fetches), so both engines can load the file and tokenize prompts. Weights are
N(0, 0.02) from numpy's PCG64 with the given seed (reproducible), norms are 1,
written as llama.cpp's converter lays Llama tensors out (blk.N.attn_q.weight
etc.; no output.weight: tied). Tensors are generated and written one at a time
(memory: the largest tensor, not the file). The logits are meaningless; the file exists to
measure speed and memory, never correctness.

Needs numpy and gguf-py (PyPI `gguf`).
"""

import argparse
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

SHAPES = {
    "135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, ffn=1536, rope_base=100000.0),
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, rope_base=500000.0),
    "3b": dict(hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, rope_base=500000.0),
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, rope_base=500000.0),
    "qwen3moe-2l": dict(hidden=2048, layers=2, heads=32, kv_heads=4, ffn=6144, rope_base=1e6,
                        head_dim=128, experts=128, experts_used=8, expert_ffn=768),
}
TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
]


def field_value(field):
    """The Python value of a GGUFReader field (scalar, string or array)."""
    kind = field.types[0]
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if kind == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


def copy_tokenizer(writer, source):
    reader = GGUFReader(source)
    vocab = None
    for key in TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field_value(field)
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_array(key, value)
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
        elif kind == GGUFValueType.STRING:
            writer.add_string(key, value)
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(key, bool(value))
        else:
            writer.add_uint32(key, int(value))
    if vocab is None:
        sys.exit(f"make_random_gguf: {source} has no tokenizer.ggml.tokens")
    return vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", default=None)
    ap.add_argument("--context-length", type=int, default=8192)
    ap.add_argument("--sliding-window", type=int, default=0)
    args = ap.parse_args()
    source = args.tokenizer_from
    if source is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        source = subprocess.check_output([os.path.join(root, "scripts", "fetch-model")],
                                         text=True).strip()
    s = SHAPES[args.shape]
    head_dim = s.get("head_dim", s["hidden"] // s["heads"])
    moe = "experts" in s
    writer = GGUFWriter(args.out, "qwen3moe" if moe else "llama")
    writer.add_name(f"random-llama-{args.shape}")
    writer.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    vocab = copy_tokenizer(writer, source)
    writer.add_context_length(args.context_length)
    if args.sliding_window > 0:
        writer.add_sliding_window(args.sliding_window)
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_dimension_count(head_dim)
    if moe:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_expert_count(s["experts"])
        writer.add_expert_used_count(s["experts_used"])
        writer.add_expert_feed_forward_length(s["expert_ffn"])
    writer.add_rope_freq_base(s["rope_base"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)

    rng = np.random.Generator(np.random.PCG64(args.seed))

    # (name, numpy shape, dtype, maker): the tensor infos go first, then each
    # tensor is made and written in turn, in this order (same seed, same bytes).
    specs = []

    def dense(name, rows, cols, dtype=np.float16):  # numpy (rows, cols) = GGUF ne (cols, rows)
        specs.append((name, (rows, cols), dtype,
                      lambda: (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
                      .astype(np.float16).astype(dtype)))  # F16 values, also in an F32 tensor

    def ones(name, n):
        specs.append((name, (n,), np.float32, lambda: np.ones(n, dtype=np.float32)))

    def experts(name, rows, cols):  # numpy (E, rows, cols) = GGUF ne (cols, rows, E)
        e = s["experts"]
        specs.append((name, (e, rows, cols), np.float16, lambda: np.stack(
            [(rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
             for _ in range(e)])))

    h, kv, q = s["hidden"], s["kv_heads"] * head_dim, s["heads"] * head_dim
    dense("token_embd.weight", vocab, h)
    ones("output_norm.weight", h)
    if moe:
        dense("output.weight", vocab, h)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", h)
        dense(p + "attn_q.weight", q, h)
        dense(p + "attn_k.weight", kv, h)
        dense(p + "attn_v.weight", kv, h)
        dense(p + "attn_output.weight", h, q)
        ones(p + "ffn_norm.weight", h)
        if moe:
            ones(p + "attn_q_norm.weight", head_dim)
            ones(p + "attn_k_norm.weight", head_dim)
            dense(p + "ffn_gate_inp.weight", s["experts"], h, np.float32)
            experts(p + "ffn_gate_exps.weight", s["expert_ffn"], h)
            experts(p + "ffn_up_exps.weight", s["expert_ffn"], h)
            experts(p + "ffn_down_exps.weight", h, s["expert_ffn"])
            continue
        dense(p + "ffn_gate.weight", s["ffn"], h)
        dense(p + "ffn_up.weight", s["ffn"], h)
        dense(p + "ffn_down.weight", h, s["ffn"])
    for name, shape, dtype, _ in specs:
        writer.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, _, _, make in specs:
        writer.write_tensor_data(make())
    writer.close()
    print(args.out)


if __name__ == "__main__":
    main()
