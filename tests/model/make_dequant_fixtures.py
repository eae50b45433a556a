#!/usr/bin/env python3
"""Writes tests/model/fixtures/dequant_fixtures.gguf, the reference data of
tests/model/dequant_test.cc and gguf_test.cc. The reference implementation is
gguf-py (pip install gguf numpy) and, for the Q/K un-permutation of llama GGUF
files, transformers' GGUF reader (pip install transformers; torch not needed).

The fixture is itself a GGUF file written by gguf-py's GGUFWriter:
  synth.<TYPE>            a 4 x 512 tensor of ggml type TYPE: for Q4_0..Q8_0
                          gguf.quants.quantize of random floats, for K-quants
                          and IQ4_NL/IQ4_XS random bytes with sane fp16
                          scales, for F32/F16/BF16
                          random floats;
  synth.<TYPE>.expected   F32, gguf.quants.dequantize of it;
  smol.<tensor>.rows      F32, the first rows of SmolLM2 tensors as gguf-py
                          dequantizes them (original ggml orientation);
  smol.<q|k>.hf           F32, rows [0, 128) of blk.0.attn_q (heads 0-1) and
                          rows [64, 128) of blk.0.attn_k (KV head 1), first 32
                          columns, after transformers' reverse permutation,
                          i.e. in Hugging Face order;
and metadata of every GGUF value type (fixture.* keys) for the parser tests.

  python3 tests/model/make_dequant_fixtures.py [--model PATH]
(default PATH: the output of scripts/fetch-model).
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "dequant_fixtures.gguf")

ROWS, COLS = 4, 512

# Byte offsets of the fp16 scale fields inside one block (ggml block layouts).
K_SCALE_FIELDS = {
    T.Q2_K: [80, 82],   # d, dmin after scales[16], qs[64]
    T.Q3_K: [108],      # d after hmask[32], qs[64], scales[12]
    T.Q4_K: [0, 2],     # d, dmin first
    T.Q5_K: [0, 2],
    T.Q6_K: [208],      # d after ql[128], qh[64], scales[16]
    T.IQ4_NL: [0],      # d first, then 16 bytes of codebook indices
    T.IQ4_XS: [0],      # d first, then scales_h, scales_l[4], qs[128]
}


def random_kquant(rng, qtype):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = ROWS * COLS // block_elems
    raw = rng.integers(0, 256, size=(nblocks, block_bytes), dtype=np.uint8)
    for off in K_SCALE_FIELDS[qtype]:
        scales = (rng.uniform(0.001, 0.05, size=nblocks)).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(ROWS, COLS // block_elems * block_bytes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model = args.model or subprocess.check_output(
        [os.path.join(HERE, "..", "..", "scripts", "fetch-model")], text=True).strip()

    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(OUT, arch="fixture")

    # Metadata of every value type.
    w.add_uint8("fixture.u8", 200)
    w.add_int8("fixture.i8", -100)
    w.add_uint16("fixture.u16", 60000)
    w.add_int16("fixture.i16", -30000)
    w.add_uint32("fixture.u32", 4000000000)
    w.add_int32("fixture.i32", -2000000000)
    w.add_uint64("fixture.u64", 18000000000000000000)
    w.add_int64("fixture.i64", -9000000000000000000)
    w.add_float32("fixture.f32", 1.5)
    w.add_float64("fixture.f64", -2.25e100)
    w.add_bool("fixture.bool", True)
    w.add_string("fixture.str", "h\u00e9llo \u4e16\u754c")
    w.add_array("fixture.arr_str", ["a", "", "\u00fc"])
    w.add_array("fixture.arr_i32", [1, -2, 3])
    w.add_array("fixture.arr_f32", [0.5, -1.25])
    w.add_array("fixture.arr_nested", [[1, 2], [3]])

    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]
    for qt in types:
        x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        if qt in K_SCALE_FIELDS:
            q = random_kquant(rng, qt)
        elif qt == T.F32:
            q = x
        else:
            q = quantize(x, qt)
        expected = dequantize(q, qt).astype(np.float32)
        assert expected.shape == (ROWS, COLS), (qt, expected.shape)
        if qt == T.F32:
            w.add_tensor(f"synth.{qt.name}", q)
        else:
            w.add_tensor(f"synth.{qt.name}", q, raw_shape=q.shape, raw_dtype=qt)
        w.add_tensor(f"synth.{qt.name}.expected", expected)

    # First rows of real SmolLM2 tensors, dequantized by gguf-py.
    r = gguf.GGUFReader(model)
    by_name = {t.name: t for t in r.tensors}
    for name, nrows in [("token_embd.weight", 3), ("blk.0.attn_q.weight", 2),
                        ("blk.0.ffn_down.weight", 2), ("blk.29.ffn_up.weight", 2),
                        ("blk.0.attn_norm.weight", None)]:
        t = by_name[name]
        full = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        rows = full if nrows is None else full[:nrows]
        w.add_tensor(f"smol.{name}.rows", np.ascontiguousarray(rows))

    # HF-order Q/K through transformers' reverse permutation.
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    proc = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    q = dequantize(np.asarray(by_name["blk.0.attn_q.weight"].data), T.Q4_1).astype(np.float32)
    k = dequantize(np.asarray(by_name["blk.0.attn_k.weight"].data), T.Q4_1).astype(np.float32)
    q_hf = proc.process(q, "blk.0.attn_q.weight").weights
    k_hf = proc.process(k, "blk.0.attn_k.weight").weights
    w.add_tensor("smol.q.hf", np.ascontiguousarray(q_hf[0:128, 0:32]))
    w.add_tensor("smol.k.hf", np.ascontiguousarray(k_hf[64:128, 0:32]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
