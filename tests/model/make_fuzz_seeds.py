#!/usr/bin/env python3
"""Writes the seed corpora of the loader fuzz targets (tests/model/corpus/).

    python3 tests/model/make_fuzz_seeds.py      # rewrites tests/model/corpus/*/seed-*

Small on purpose (each seed under a few KB): the fuzzers start from these and
from the committed fixtures (scripts/fuzz adds those). GGUF files are written
with struct following ggml's docs/gguf.md (little-endian, v3 unless stated),
one tensor of every ggml type the reader knows, each a single block of
deterministic pseudo-random bytes (fp16 scales masked to finite values), so the
fuzzer starts with every quantized layout reachable. Files named regress-* in
the corpus directories are inputs the fuzzer found; this script leaves them.
"""
import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# GGUF metadata value types (gguf.md).
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml types: (id, block elements, block bytes).
GGML = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q8_1": (9, 32, 36),
    "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "Q8_K": (15, 256, 292),
    "I8": (24, 1, 1), "I16": (25, 1, 2), "I32": (26, 1, 4), "I64": (27, 1, 8),
    "F64": (28, 1, 8), "BF16": (30, 1, 2),
}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        for it in items:
            out += gval(et, it)
        return out
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
           U64: "Q", I64: "q", F64: "d"}[t]
    return struct.pack("<" + fmt, v)


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, type name, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    offset = 0
    infos, blobs = b"", b""
    for name, dims, tname, data in tensors:
        infos += gstr(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", GGML[tname][0], offset)
        pad = (-len(data)) % alignment
        blobs += data + b"\0" * pad
        offset += len(data) + pad
    out += infos
    out += b"\0" * ((-len(out)) % alignment)
    return out + blobs


def block_bytes(rng, tname, blocks):
    _, _, nbytes = GGML[tname]
    data = bytearray(rng.getrandbits(8) for _ in range(nbytes * blocks))
    # Keep fp16 scales finite: clear the top exponent bit of every other byte.
    for i in range(1, len(data), 2):
        data[i] &= 0xBB
    return bytes(data)


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def llama_kvs(arch="llama"):
    p = arch + "."
    return [
        ("general.architecture", STR, arch),
        (p + "block_count", U32, 1),
        (p + "embedding_length", U32, 32),
        (p + "feed_forward_length", U32, 32),
        (p + "attention.head_count", U32, 2),
        (p + "attention.head_count_kv", U32, 1),
        (p + "attention.layer_norm_rms_epsilon", F32, 1e-5),
        (p + "rope.freq_base", F32, 10000.0),
        (p + "context_length", U32, 64),
    ]


def gpt2_tokenizer_kvs():
    tokens = ["h", "e", "l", "o", "he", "ll", "hell", "hello", "\u0120", "w", "\u0120w",
              "<|endoftext|>"]
    merges = ["h e", "l l", "he ll", "hell o", "\u0120 w"]
    return [
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "smollm"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, [1] * (len(tokens) - 1) + [3])),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, len(tokens) - 1),
        ("tokenizer.ggml.eos_token_id", U32, len(tokens) - 1),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STR,
         "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"),
    ]


def spm_tokenizer_kvs():
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0x41>", "\u2581", "a", "b", "\u2581a", "ab"]
    types = [2, 3, 3, 6, 6, 1, 1, 1, 1, 1]
    return [
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.scores", ARR, (F32, [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -1.5, -2.5])),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.ggml.add_space_prefix", BOOL, True),
    ]


def gguf_seeds():
    rng = random.Random(10)
    # Every ggml type, one block (two rows for the 1-element types).
    tensors = []
    for tname, (_, be, _) in GGML.items():
        dims = [be] if be > 1 else [4, 2]
        blocks = 1 if be > 1 else 8
        tensors.append(("t." + tname, dims, tname, block_bytes(rng, tname, blocks)))
    write("gguf", "seed-all-types.gguf", gguf([("general.name", STR, "all types")], tensors))
    # A complete tiny llama (hidden 32, 2 heads of 16, 1 KV head, MLP 32, vocab
    # 12, one layer, a different type per matrix) with a byte-level BPE
    # tokenizer and a chat template: LoadLlamaWeights accepts it.
    ones = struct.pack("<32f", *[1.0] * 32)
    def mat(name, cols, rows, tname):
        be = GGML[tname][1]
        return (name, [cols, rows], tname, block_bytes(rng, tname, cols * rows // be))
    tensors = [
        mat("token_embd.weight", 32, 12, "Q8_0"),
        ("output_norm.weight", [32], "F32", ones),
        mat("output.weight", 32, 12, "Q4_0"),
        ("blk.0.attn_norm.weight", [32], "F32", ones),
        mat("blk.0.attn_q.weight", 32, 32, "Q4_0"),
        mat("blk.0.attn_k.weight", 32, 16, "F16"),
        mat("blk.0.attn_v.weight", 32, 16, "Q5_0"),
        mat("blk.0.attn_output.weight", 32, 32, "Q4_1"),
        ("blk.0.ffn_norm.weight", [32], "F32", ones),
        mat("blk.0.ffn_gate.weight", 32, 32, "Q5_1"),
        mat("blk.0.ffn_up.weight", 32, 32, "Q8_0"),
        mat("blk.0.ffn_down.weight", 32, 32, "Q4_0"),
    ]
    write("gguf", "seed-llama-gpt2.gguf", gguf(llama_kvs() + gpt2_tokenizer_kvs(), tensors))
    tensors_llama = list(tensors)
    # The same as a Llama 3.x file: llama.cpp's per-frequency RoPE factors
    # (rope_freqs.weight, head_size / 2 floats) as convert_hf_to_gguf.py writes them.
    freqs = ("rope_freqs.weight", [8], "F32", struct.pack("<8f", 1, 1, 1.5, 2.5, 4, 8, 8, 8))
    write("gguf", "seed-llama3-rope-freqs.gguf",
          gguf(llama_kvs() + gpt2_tokenizer_kvs(), [freqs] + tensors))
    # The same as a Qwen3 file: per-head q/k RMSNorm weights (head_size 16 each),
    # head size given by key_length.
    half = struct.pack("<16f", *[0.5 + i / 16 for i in range(16)])
    qk_norms = [("blk.0.attn_q_norm.weight", [16], "F32", half),
                ("blk.0.attn_k_norm.weight", [16], "F32", half)]
    write("gguf", "seed-qwen3-qk-norm.gguf",
          gguf(llama_kvs("qwen3") + [("qwen3.attention.key_length", U32, 16)] +
               gpt2_tokenizer_kvs(), tensors + qk_norms))
    # Qwen2 with linear rope scaling, a SentencePiece vocabulary, alignment 64, v2.
    kvs = llama_kvs("qwen2") + [
        ("qwen2.rope.scaling.type", STR, "linear"),
        ("qwen2.rope.scaling.factor", F32, 2.0),
        ("general.alignment", U32, 64),
    ] + spm_tokenizer_kvs()
    tensors = [("output.weight", [256, 2], "Q6_K", block_bytes(rng, "Q6_K", 2)),
               ("blk.0.ffn_up.weight", [32, 2], "Q5_1", block_bytes(rng, "Q5_1", 2))]
    write("gguf", "seed-qwen2-spm-v2.gguf", gguf(kvs, tensors, version=2, alignment=64))
    # Every metadata value type, nested arrays, no tensors.
    kvs = [("u8", U8, 1), ("i8", I8, -1), ("u16", U16, 2), ("i16", I16, -2), ("u32", U32, 3),
           ("i32", I32, -3), ("f32", F32, 0.5), ("bool", BOOL, True), ("str", STR, "s"),
           ("u64", U64, 2**63), ("i64", I64, -(2**40)), ("f64", F64, 1e300),
           ("nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"])]))]
    # The nested value needs its inner element types written explicitly.
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for k, t, v in kvs:
        body += gstr(k) + struct.pack("<I", t)
        if k == "nested":
            body += struct.pack("<IQ", ARR, 2)
            body += struct.pack("<IQ", U8, 2) + b"\x01\x02"
            body += struct.pack("<IQ", STR, 1) + gstr("x")
        else:
            body += gval(t, v)
    write("gguf", "seed-value-types.gguf", body)
    # A Qwen3-MoE file: q/k norms, a router (ffn_gate_inp, F32 [4, 32]) and 4
    # experts of width 32 in 3-D tensors (ggml ne [in, out, experts]), each in
    # its own type, as llama.cpp's converter lays them out.
    dense = [t for t in tensors_llama if not t[0].startswith("blk.0.ffn_")
             or t[0] == "blk.0.ffn_norm.weight"]
    def experts(name, tname):
        be = GGML[tname][1]
        return (name, [32, 32, 4], tname, block_bytes(rng, tname, 32 * 32 * 4 // be))
    router = ("blk.0.ffn_gate_inp.weight", [32, 4], "F32",
              struct.pack("<128f", *[((i * 37) % 17 - 8) / 16 for i in range(128)]))
    moe = [router, experts("blk.0.ffn_gate_exps.weight", "Q8_0"),
           experts("blk.0.ffn_up_exps.weight", "F16"),
           experts("blk.0.ffn_down_exps.weight", "Q4_0")]
    write("gguf", "seed-qwen3moe-experts.gguf",
          gguf(llama_kvs("qwen3moe") + [("qwen3moe.attention.key_length", U32, 16),
                                        ("qwen3moe.expert_count", U32, 4),
                                        ("qwen3moe.expert_used_count", U32, 2),
                                        ("qwen3moe.expert_feed_forward_length", U32, 32)] +
               gpt2_tokenizer_kvs(), dense + qk_norms + moe))

    # The same experts as a Qwen2-MoE file (qwen2moe): Q/K/V biases and a gated
    # shared expert of width 32 (ffn_*_shexp; the gate ffn_gate_inp_shexp 1-D).
    biases = [("blk.0.attn_q.bias", [32], "F32", ones), ("blk.0.attn_k.bias", [16], "F32", half),
              ("blk.0.attn_v.bias", [16], "F32", half)]
    shexp = [mat("blk.0.ffn_gate_shexp.weight", 32, 32, "Q8_0"),
             mat("blk.0.ffn_up_shexp.weight", 32, 32, "Q4_0"),
             mat("blk.0.ffn_down_shexp.weight", 32, 32, "F16"),
             ("blk.0.ffn_gate_inp_shexp.weight", [32], "F32",
              struct.pack("<32f", *[(i % 5 - 2) / 8 for i in range(32)]))]
    write("gguf", "seed-qwen2moe-shared.gguf",
          gguf(llama_kvs("qwen2moe") + [("qwen2moe.expert_count", U32, 4),
                                        ("qwen2moe.expert_used_count", U32, 2),
                                        ("qwen2moe.expert_feed_forward_length", U32, 32),
                                        ("qwen2moe.expert_shared_feed_forward_length", U32, 32)] +
               gpt2_tokenizer_kvs(), dense + biases + moe + shexp))
    # A Phi-4-mini-style file (phi3): fused attn_qkv / ffn_up, LongRoPE factor
    # tensors (rotary_dim / 2 = 6 each) with the original context and the
    # attention factor, 12 of each head's 16 dimensions rotated.
    fused = ("blk.0.attn_q.", "blk.0.attn_k.", "blk.0.attn_v.", "blk.0.ffn_gate.", "blk.0.ffn_up.")
    phi3 = [t for t in tensors_llama if not t[0].startswith(fused)]
    phi3 += [mat("blk.0.attn_qkv.weight", 32, 64, "Q8_0"), mat("blk.0.ffn_up.weight", 32, 64, "F16"),
             ("rope_factors_short.weight", [6], "F32", struct.pack("<6f", 1, 1, 1.1, 1.2, 1.3, 1.5)),
             ("rope_factors_long.weight", [6], "F32", struct.pack("<6f", 1, 2, 4, 8, 16, 32))]
    write("gguf", "seed-phi3-longrope.gguf",
          gguf(llama_kvs("phi3") + [("phi3.rope.dimension_count", U32, 12),
                                    ("phi3.rope.scaling.original_context_length", U32, 16),
                                    ("phi3.rope.scaling.attn_factor", F32, 1.19),
                                    ("phi3.attention.sliding_window", U32, 0)] +
               gpt2_tokenizer_kvs(), phi3))


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, data bytes)]."""
    header, offset, blob = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blob += data
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + blob


def safetensors_seeds():
    f32 = struct.pack("<6f", 0.0, 1.0, -2.5, 3.25, 1e-3, -7.0)
    f16 = struct.pack("<4e", 1.0, -0.5, 65504.0, 6e-8)
    bf16 = b"\x80\x3f\x00\xc0\x49\x40\x00\x00"
    write("safetensors", "seed-float.safetensors", safetensors([
        ("model.embed_tokens.weight", "F32", [3, 2], f32),
        ("model.norm.weight", "F16", [4], f16),
        ("lm_head.weight", "BF16", [2, 2], bf16),
    ], {"format": "pt"}))
    write("safetensors", "seed-int-scalar-empty.safetensors", safetensors([
        ("ids", "I64", [2], struct.pack("<2q", 1, -1)),
        ("scalar", "F32", [], struct.pack("<f", 4.0)),
        ("empty", "BF16", [0, 4], b""),
        ("mask", "BOOL", [3], b"\x01\x00\x01"),
        ("fp8", "F8_E4M3", [2], b"\x38\xb8"),
    ]))
    write("safetensors", "seed-u-types.safetensors", safetensors([
        ("a", "U8", [1, 1, 2], b"\x01\x02"), ("b", "I16", [1], b"\x01\x00"),
        ("c", "U32", [1], b"\x01\x00\x00\x00"), ("d", "F64", [1], struct.pack("<d", 2.0)),
    ]))


def config_seeds():
    base = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 1,
            "eos_token_id": [2, 3],
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}
    write("hf_config", "seed-llama3.json", json.dumps(base, indent=1).encode())
    qwen = dict(base, architectures=["Qwen2ForCausalLM"], rope_scaling=None, eos_token_id=2,
                head_dim=16, attention_bias=True)
    write("hf_config", "seed-qwen2.json", json.dumps(qwen).encode())
    qwen3 = dict(base, architectures=["Qwen3ForCausalLM"], rope_scaling=None, eos_token_id=2,
                 head_dim=32, attention_bias=False)
    write("hf_config", "seed-qwen3.json", json.dumps(qwen3).encode())
    mistral = dict(base, architectures=["MistralForCausalLM"],
                   rope_scaling={"type": "linear", "factor": 2.0}, tie_word_embeddings=False)
    del mistral["num_key_value_heads"]
    write("hf_config", "seed-mistral-linear.json", json.dumps(mistral).encode())
    window = dict(qwen, use_sliding_window=True, sliding_window=32, max_window_layers=1,
                  layer_types=["full_attention", "sliding_attention"])
    write("hf_config", "seed-qwen2-window.json", json.dumps(window).encode())
    gemma2 = dict(base, architectures=["Gemma2ForCausalLM"], head_dim=32,
                  hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=16)
    del gemma2["tie_word_embeddings"]
    write("hf_config", "seed-gemma2.json", json.dumps(gemma2).encode())
    gemma3 = dict(base, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                  head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                  sliding_window_pattern=2, rope_local_base_freq=10000.0,
                  rope_scaling={"rope_type": "linear", "factor": 8.0},
                  final_logit_softcapping=None, attn_logit_softcapping=None)
    write("hf_config", "seed-gemma3.json", json.dumps(gemma3).encode())
    mixtral = dict(base, architectures=["MixtralForCausalLM"], rope_scaling=None,
                   num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    write("hf_config", "seed-mixtral.json", json.dumps(mixtral).encode())
    qwen3_moe = dict(qwen3, architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[])
    write("hf_config", "seed-qwen3-moe.json", json.dumps(qwen3_moe).encode())
    phi4_mini = dict(base, architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.75,
                     original_max_position_embeddings=512, sliding_window=None,
                     rope_scaling={"type": "longrope",
                                   "short_factor": [1.0 + 0.05 * i for i in range(6)],
                                   "long_factor": [1.0 + 2.0 * i for i in range(6)]})
    write("hf_config", "seed-phi4-mini-longrope.json", json.dumps(phi4_mini).encode())
    qwen2_moe = dict(qwen, architectures=["Qwen2MoeForCausalLM"], num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=64, norm_topk_prob=False,
                     decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True)
    write("hf_config", "seed-qwen2-moe-shared.json", json.dumps(qwen2_moe).encode())


def tokenizer_seeds():
    vocab = {"h": 0, "e": 1, "l": 2, "o": 3, "he": 4, "ll": 5, "hell": 6, "hello": 7,
             "\u0120": 8, "\u0120w": 9, "1": 10, "w": 11}
    bl = {
        "version": "1.0",
        "added_tokens": [{"id": 12, "content": "<|endoftext|>", "special": True,
                          "lstrip": False, "rstrip": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "Split", "pattern": {"Regex": "[a-z]+| ?\\p{L}+"}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": ["h e", "l l", ["he", "ll"], "hell o",
                                                             "\u0120 w"],
                  "ignore_merges": True, "unk_token": None},
    }
    cfg = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>"},
           "add_bos_token": True, "chat_template": "{{ messages[0]['content'] }}"}
    write("hf_tokenizer", "seed-bytelevel.json",
          json.dumps(bl).encode() + b"\0" + json.dumps(cfg).encode())
    spm_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "\u2581": 4, "a": 5, "b": 6,
                 "\u2581a": 7, "ab": 8}
    spm = {
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                         {"id": 1, "content": "<s>", "special": True},
                         {"id": 2, "content": "</s>", "special": True}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence"},
        "model": {"type": "BPE", "vocab": spm_vocab, "merges": ["\u2581 a", "a b"],
                  "byte_fallback": True, "unk_token": "<unk>"},
    }
    write("hf_tokenizer", "seed-spm.json", json.dumps(spm).encode())
    meta = dict(spm, normalizer=None,
                pre_tokenizer={"type": "Metaspace", "replacement": "\u2581",
                               "prepend_scheme": "first", "split": False})
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_eos_token": True,
           "chat_template": [{"name": "default", "template": "x"}]}
    write("hf_tokenizer", "seed-metaspace.json",
          json.dumps(meta).encode() + b"\0" + json.dumps(cfg).encode())


def main():
    gguf_seeds()
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()


if __name__ == "__main__":
    main()
