#!/usr/bin/env python3
"""Writes the GGUF SentencePiece tokenizer reference (issue 15).

    pip install sentencepiece protobuf gguf tokenizers
    python3 tests/tokenizer/make_spm_gguf.py

The spm-tiny tokenizer (tests/fixtures/spm-tiny-tokenizer/, a 600-piece
SentencePiece BPE model with byte fallback trained by make_fixtures.py) as a
vocab-only GGUF, laid out the way llama.cpp's convert_hf_to_gguf.py
(_create_vocab_sentencepiece) writes a SentencePiece vocabulary:
tokenizer.ggml.model "llama", tokens = pieces, scores = piece scores, token_type
1 normal / 2 unknown / 3 control / 6 byte, bos / eos / unk ids, add_bos_token.
The reference ids come from sentencepiece itself (nobody here wrote it).

make_fixtures.py trained the model in a temporary folder and kept only
tokenizer.json, so the .model is rebuilt from it: the pieces in id order with
the scores sentencepiece's BPE trainer gives (bpe_model_trainer.cc: the i-th
piece after the 3 control and 256 byte pieces scores -i; control and byte
pieces 0), and the trainer settings make_fixtures.py used (add_dummy_prefix,
no whitespace cleanup, identity normalization, byte fallback). The rebuilt
model must reproduce the ids the original sentencepiece model gave for every
string of tests/tokenizer/fixtures/spm_tiny.json ("sentencepiece_ids"), or this
script stops without writing anything.

Writes (committed):
  tests/fixtures/spm-tiny-tokenizer/spm-tiny.vocab.gguf
  tests/tokenizer/fixtures/spm_tiny_gguf.json
      per string: sentencepiece ids (no BOS), transformers/tokenizers ids of
      tokenizer.json (no BOS; special tokens written as text are parsed), and
      sentencepiece's decode of its ids.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import make_fixtures  # noqa: E402  (PROMPTS, HARD, generated_strings)

TOKENIZER_DIR = os.path.join(ROOT, "tests", "fixtures", "spm-tiny-tokenizer")
GGUF_PATH = os.path.join(TOKENIZER_DIR, "spm-tiny.vocab.gguf")
FIXTURE = os.path.join(HERE, "fixtures", "spm_tiny_gguf.json")
FIRST_NORMAL = 3 + 256  # <unk> <s> </s>, then <0x00>..<0xFF>

EXTRA = [
    "The history of the lighthouse is, in many ways, the history of coastal trade.",
    "naïve café — résumé, Ελληνικά, Русский текст, 日本語 テキスト, 中文 测试 😀",
    "▁ already has the meta symbol ▁▁ twice",
    "tabs\tand\nnewlines\r\n  mixed   spaces  ",
    "x" * 64,
    "12345 678.9 -0.001",
    "</s> <s> <unk> as text",
]


def build_model_proto(vocab):
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(vocab)
    ts.byte_fallback = True
    ts.split_digits = True
    ts.allow_whitespace_only_pieces = True
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = 0, 1, 2, -1
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = True
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    for i, piece in enumerate(vocab):
        p = m.pieces.add()
        p.piece = piece
        if i == 0:
            p.type, p.score = pb.ModelProto.SentencePiece.UNKNOWN, 0.0
        elif i < 3:
            p.type, p.score = pb.ModelProto.SentencePiece.CONTROL, 0.0
        elif i < FIRST_NORMAL:
            assert piece == f"<0x{i - 3:02X}>", piece
            p.type, p.score = pb.ModelProto.SentencePiece.BYTE, 0.0
        else:
            p.type, p.score = pb.ModelProto.SentencePiece.NORMAL, -float(i - FIRST_NORMAL)
    return m


def write_gguf(sp, path):
    """convert_hf_to_gguf.py's _create_vocab_sentencepiece, vocab only."""
    import gguf
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        t = gguf.TokenType.NORMAL
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        types.append(t)
    w = gguf.GGUFWriter(path + ".tmp", "llama")
    w.add_name("spm-tiny tokenizer (vocab only)")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)


def main():
    import importlib.metadata
    import sentencepiece as spm
    from tokenizers import Tokenizer

    with open(os.path.join(TOKENIZER_DIR, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    inv = {i: p for p, i in tj["model"]["vocab"].items()}
    vocab = [inv[i] for i in range(len(inv))]
    sp = spm.SentencePieceProcessor(model_proto=build_model_proto(vocab).SerializeToString())

    with open(os.path.join(HERE, "fixtures", "spm_tiny.json"), encoding="utf-8") as f:
        original = json.load(f)["cases"]
    bad = [c["text"] for c in original if sp.encode(c["text"]) != c["sentencepiece_ids"]]
    if bad:
        sys.exit(f"make_spm_gguf: the rebuilt model differs from the trained one on {bad!r}")
    print(f"rebuilt sentencepiece model reproduces all {len(original)} original encodings",
          file=sys.stderr)

    hf = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    texts = list(dict.fromkeys(make_fixtures.PROMPTS + make_fixtures.HARD + EXTRA
                               + make_fixtures.generated_strings()))
    cases, differ = [], 0
    for t in texts:
        ids = sp.encode(t)
        hf_ids = hf.encode(t, add_special_tokens=False).ids
        differ += ids != hf_ids
        cases.append({"text": t, "sentencepiece_ids": ids, "hf_ids": hf_ids,
                      "sentencepiece_decode": sp.decode(ids)})
    print(f"{len(cases)} strings; sentencepiece and tokenizers differ on {differ} "
          "(special tokens written as text)", file=sys.stderr)
    write_gguf(sp, GGUF_PATH)
    vers = {"python": sys.version.split()[0]}
    for pkg in ("sentencepiece", "gguf", "tokenizers", "protobuf"):
        vers[pkg] = importlib.metadata.version(pkg)
    make_fixtures.write_json(FIXTURE, {
        "generator": "tests/tokenizer/make_spm_gguf.py",
        "reference": "sentencepiece (SentencePieceProcessor.encode, no BOS) on the spm-tiny "
                     "model; hf_ids: tokenizers on tests/fixtures/spm-tiny-tokenizer/tokenizer.json",
        "versions": vers,
        "gguf": os.path.relpath(GGUF_PATH, ROOT),
        "bos_token_id": sp.bos_id(), "eos_token_id": sp.eos_id(), "unk_token_id": sp.unk_id(),
        "vocab_size": sp.get_piece_size(),
        "strings_where_ids_differ": differ,
        "cases": cases})


if __name__ == "__main__":
    main()
