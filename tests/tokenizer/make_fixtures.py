#!/usr/bin/env python3
"""Regenerates the tokenizer reference fixtures with Hugging Face transformers /
tokenizers (nobody here wrote them).

    scripts/install-deps --reference
    python3 tests/tokenizer/make_fixtures.py [--model PATH.gguf]
    python3 tests/tokenizer/make_fixtures.py --ids-only   # pip install tokenizers gguf

Writes (committed):
  tests/fixtures/smollm2-tokenizer/tokenizer.json, tokenizer_config.json
      SmolLM2's tokenizer as transformers builds it from the GGUF, with the
      pre-tokenizer the GGUF declares (tokenizer.ggml.pre; transformers drops it).
  tests/tokenizer/fixtures/smollm2.json
      token ids of prompts and hard strings, decodes of those ids and of random id
      sequences (skip_special_tokens false/true), chat template renderings.
  tests/fixtures/spm-tiny-tokenizer/tokenizer.json and
  tests/tokenizer/fixtures/spm_tiny.json
      a small SentencePiece BPE model with byte fallback (trained here with the
      sentencepiece trainer, converted to tokenizer.json by transformers) and the
      ids HF gives for the same strings.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain PagedAttention in one sentence.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog.",
    "Translate to German: I would like a cup of coffee, please.",
    "List three prime numbers greater than 100.",
    "Hello! How are you doing today?",
    "Summarize: Large language models generate text one token at a time.",
    "Once upon a time, in a land far, far away,",
]

HARD = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t\tindented\twith tabs",
    "a    b     c",
    "trailing spaces   ",
    "   leading spaces",
    "line one\nline two\r\nline three\n\n  indented",
    "0 1 12 123 1234 12345 123456 1234567 12345678901234567890",
    "3.14159 -42 1e-9 0x1F 1,000,000",
    "日本語のテキストです。東京は大きい都市です。",
    "中文测试：你好，世界！",
    "한국어 텍스트",
    "Emoji: 😀😃😄 👍🏽 🇫🇷 ❤️",
    "ZWJ family: 👨‍👩‍👧‍👦 and 👩🏽‍💻",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353",
    "Precomposed: é ä ñ Å",
    "Mixed scripts: Hello мир 世界 مرحبا שלום",
    "Ελληνικά και Русский текст",
    "<|im_start|>user\nHi<|im_end|>",
    "Fake special: <|im_start|> and <|endoftext|> inside text",
    "Partial <|im_sta and <|im_end",
    "<s> [INST] not llama [/INST] </s>",
    "int main() { return printf(\"%d\\n\", 42); }",
    "for (auto& [k, v] : map) { sum += v * 2; }  // comment",
    "x = {'a': [1, 2, 3], \"b\": None}  # python",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "URL: https://example.com/path?query=1&b=2#frag",
    "email@example.org, @mention #hashtag $100 50% ^_^ ~tilde~ |pipe|",
    "I'm you're we've they'll she'd it's DON'T Can'T",
    "supercalifragilisticexpialidocious" * 4,
    "a" * 300,
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "Ünïcödé ŝţŕïñğ wîth àccents",
    "\u00a0non-breaking\u00a0space and\u2003em space\u3000ideographic",
    "zero\u200bwidth\u200cjoiners\u200d",
    "Math: ∑ x² ≤ ∞, ∀ε>0 ∃δ",
    "!!!??? ... --- *** ___",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier",
    # Runs of spaces (and other whitespace) before digits: where a pre-tokenizer
    # that splits digits first (SmolLM2's) and plain ByteLevel disagree.
    "a  12 apples",
    "x   3 y    45 z     678",
    "  7",
    "     2024-01-01",
    "\t9\n  8\r\n   7",
    "1  2   3    4     5",
    "price:  $ 1 000,  00 EUR",
    "日本  2024年  12月",
    "🙂  3 🙂   4",
    "Ω  9 and  ٣٤ and  ５６ and  ² ½ Ⅻ",
    "v1.2.3  (build  42)",
    "arr[  0] = x  -  1;  // i  +=  2",
]

# Pieces of the generated strings (GENERATED_COUNT of them, 1-12 pieces each, from
# a seeded generator): where pre-tokenizers go wrong. Runs of spaces, tabs and
# newlines next to digits (ASCII, Arabic-Indic, full-width, superscript, fraction,
# Roman numeral), letters of several scripts, CJK, emoji with modifiers and
# joiners, combining marks, code punctuation, contractions, special-token look-alikes.
GENERATED_PIECES = [
    " ", "  ", "   ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "0", "7", "12", "2024", "3.14",
    "\u0663\u0664", "\uff15\uff16", "\u00b2", "\u00bd", "\u216b", "a", "apples", "The",
    "don't", "I'm", "\u0645\u0631\u062d\u0628\u0627", "\u043c\u0438\u0440",
    "\u65e5\u672c\u8a9e", "\u6771\u4eac", "\ud55c\uad6d\uc5b4", "\U0001f600",
    "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u2764\ufe0f",
    "e\u0301", "{", "}", "()", "[i]", "->", "==", "//", "#", "$", "%", "_", "x_1",
    "<|im_start|>", "<|im_end", ".", ",", "!?"]
GENERATED_COUNT = 200


def generated_strings(seed=2026):
    rng = random.Random(seed)
    return ["".join(rng.choice(GENERATED_PIECES) for _ in range(rng.randint(1, 12)))
            for _ in range(GENERATED_COUNT)]


def build_messages():
    sys_msg = {"role": "system", "content": "You are a concise assistant."}
    u1 = {"role": "user", "content": "What is 2+2?"}
    a1 = {"role": "assistant", "content": "4"}
    u2 = {"role": "user", "content": "  And times three?  \n"}
    return [
        ("user_only", [u1]),
        ("with_system", [sys_msg, u1]),
        ("multi_turn", [u1, a1, u2]),
        ("system_multi_turn", [sys_msg, u1, a1, u2]),
        ("unicode", [{"role": "user", "content": "Bonjour 😀 — 日本"}]),
    ]


# Well-known chat templates of other Llama-family models (template text as those
# models publish it in tokenizer_config.json), rendered here by transformers'
# Jinja to check the C++ renderer of each recognised family.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def render_all(tok, template, bos, eos):
    out = []
    for name, messages in build_messages():
        for gen in (False, True):
            try:
                text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                               add_generation_prompt=gen, bos_token=bos,
                                               eos_token=eos)
                out.append({"name": name, "messages": messages, "add_generation_prompt": gen,
                            "text": text})
            except Exception as e:  # the template rejects this conversation
                out.append({"name": name, "messages": messages, "add_generation_prompt": gen,
                            "error": str(e)})
    return out


def encode_cases(tok, strings):
    fast = tok.backend_tokenizer if hasattr(tok, "backend_tokenizer") else tok
    cases = []
    for s in strings:
        enc = fast.encode(s, add_special_tokens=True)
        raw = fast.encode(s, add_special_tokens=False)
        cases.append({
            "text": s,
            "ids": enc.ids,
            "ids_no_special": raw.ids,
            "decode": fast.decode(enc.ids, skip_special_tokens=False),
            "decode_skip_special": fast.decode(enc.ids, skip_special_tokens=True),
        })
    return cases


def random_decodes(fast, vocab_size, emoji_ids, rng, count=40):
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        ids = []
        for _ in range(n):
            r = rng.random()
            if r < 0.35 and emoji_ids:
                ids.append(rng.choice(emoji_ids))
            elif r < 0.45:
                ids.append(rng.randrange(0, min(vocab_size, 300)))
            else:
                ids.append(rng.randrange(0, vocab_size))
        out.append({"ids": ids,
                    "decode": fast.decode(ids, skip_special_tokens=False),
                    "decode_skip_special": fast.decode(ids, skip_special_tokens=True)})
    return out


# GGUF tokenizer.ggml.pre names whose pre-tokenizer splits every digit off before
# the GPT-2 ByteLevel regex: llama.cpp (src/llama-vocab.cpp) runs the regexes
# "\\p{N}" then the GPT-2 one for LLAMA_VOCAB_PRE_TYPE_SMOLLM / STARCODER / REFACT /
# COMMAND_R / CODESHELL / EXAONE / MINERVA, and those models' own tokenizer.json
# say the same with Sequence[Digits(individual_digits=true), ByteLevel].
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}


def gguf_pre_name(model_path):
    import gguf
    field = gguf.GGUFReader(model_path).fields.get("tokenizer.ggml.pre")
    return bytes(field.parts[field.data[0]]).decode("utf-8") if field else "default"


def make_pre_tokenizer_faithful(fast, pre_name):
    """transformers' GGUF converter ignores tokenizer.ggml.pre and always builds a
    plain ByteLevel pre-tokenizer. Put back what the model's own tokenizer.json
    has, so that the fixture tokenizes as the model (and llama.cpp) does: for
    SmolLM2 "a  12 apples" is [81, 256, 33, 34, 13855], not 6 ids."""
    from tokenizers import pre_tokenizers
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                          use_regex=True)
    if pre_name in DIGIT_SPLIT_PRE:
        fast.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre_name in ("default", "gpt2", "gpt-2"):
        fast.pre_tokenizer = byte_level
    else:
        raise SystemExit(f"make_fixtures.py: no HF pre-tokenizer known for GGUF pre '{pre_name}'")
    return f"GGUF tokenizer.ggml.pre '{pre_name}' -> " + json.dumps(
        json.loads(fast.to_str())["pre_tokenizer"], separators=(",", ":"))


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(path, ROOT))


def smollm2(model_path, rng):
    from transformers import AutoTokenizer
    import gguf

    d, name = os.path.split(model_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    pre_tokenizer = make_pre_tokenizer_faithful(tok.backend_tokenizer, gguf_pre_name(model_path))
    reader = gguf.GGUFReader(model_path)
    field = reader.fields["tokenizer.chat_template"]
    gguf_template = bytes(field.parts[field.data[0]]).decode("utf-8")

    out_dir = os.path.join(ROOT, "tests/fixtures/smollm2-tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    tok.backend_tokenizer.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    config = {
        "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
        "add_eos_token": bool(getattr(tok, "add_eos_token", False)),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "unk_token": tok.unk_token,
        "pad_token": tok.pad_token,
        "chat_template": gguf_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer",
    }
    write_json(os.path.join(out_dir, "tokenizer_config.json"), config)

    fast = tok.backend_tokenizer
    emoji_ids = []
    for s in ["😀👍🏽🇫🇷❤️👨‍👩‍👧‍👦", "日本語", "é ñ", "한국어"]:
        emoji_ids += fast.encode(s, add_special_tokens=False).ids
    fixtures = {
        "generator": "tests/tokenizer/make_fixtures.py",
        "transformers_tokenizer": type(tok).__name__,
        "model": name,
        "pre_tokenizer": pre_tokenizer,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": gguf_template,
        "prompts": encode_cases(tok, PROMPTS),
        "hard": encode_cases(tok, HARD),
        "generated": encode_cases(tok, generated_strings()),
        "random_decodes": random_decodes(fast, fast.get_vocab_size(), emoji_ids, rng),
        "chat": {
            "smollm2": render_all(tok, gguf_template, tok.bos_token, tok.eos_token),
            "llama2": {"template": LLAMA2_TEMPLATE, "bos": "<s>", "eos": "</s>",
                       "renderings": render_all(tok, LLAMA2_TEMPLATE, "<s>", "</s>")},
            "llama3": {"template": LLAMA3_TEMPLATE, "bos": "<|begin_of_text|>", "eos": "<|eot_id|>",
                       "renderings": render_all(tok, LLAMA3_TEMPLATE, "<|begin_of_text|>",
                                                "<|eot_id|>")},
            "mistral": {"template": MISTRAL_TEMPLATE, "bos": "<s>", "eos": "</s>",
                        "renderings": render_all(tok, MISTRAL_TEMPLATE, "<s>", "</s>")},
        },
    }
    # Chat prompts as ids (template rendering followed by encoding with specials).
    for r in fixtures["chat"]["smollm2"]:
        if "text" in r:
            r["ids"] = fast.encode(r["text"], add_special_tokens=False).ids
    write_json(os.path.join(ROOT, "tests/tokenizer/fixtures/smollm2.json"), fixtures)


def spm_tiny(rng):
    import sentencepiece as spm
    from tokenizers import Tokenizer as HfTokenizer

    corpus = []
    for i in range(300):
        corpus.append(PROMPTS[i % len(PROMPTS)])
        corpus.append(" ".join(rng.choice(PROMPTS).split()[::-1]))
    corpus += ["日本語 テキスト", "中文 测试", "Ελληνικά", "Русский текст"] * 20
    with tempfile.TemporaryDirectory() as tmp:
        text_path = os.path.join(tmp, "corpus.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus))
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=text_path, model_prefix=prefix, model_type="bpe", vocab_size=600,
            byte_fallback=True, character_coverage=0.9995, add_dummy_prefix=True,
            split_digits=True, allow_whitespace_only_pieces=True,
            remove_extra_whitespaces=False, normalization_rule_name="identity",
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    # tokenizer.json as transformers' LlamaConverter (legacy) lays it out: BPE with
    # merges from transformers' generate_merges, byte fallback, Prepend + Replace
    # normalizer. (The converter itself fails on SentencePiece BPE models in
    # transformers 5.x, so its few steps are spelled out with the same pieces.)
    from tokenizers import AddedToken, Tokenizer as HfTokenizer, decoders, models, normalizers
    from transformers.convert_slow_tokenizer import generate_merges
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = generate_merges(vocab)
    hf = HfTokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    hf.add_special_tokens([AddedToken(t, normalized=False, special=True)
                           for t in ("<unk>", "<s>", "</s>")])
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                          normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    out_dir = os.path.join(ROOT, "tests/fixtures/spm-tiny-tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    hf.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": LLAMA2_TEMPLATE, "legacy": True})
    hf = HfTokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    mismatches = 0
    cases = []
    for s in PROMPTS + HARD:
        ids = hf.encode(s, add_special_tokens=False).ids
        mismatches += ids != sp.encode(s)
        cases.append({"text": s, "ids": ids, "sentencepiece_ids": sp.encode(s),
                      "decode": hf.decode(ids, skip_special_tokens=True)})
    print(f"spm-tiny: HF and sentencepiece ids differ on {mismatches} of {len(cases)} strings")
    write_json(os.path.join(ROOT, "tests/tokenizer/fixtures/spm_tiny.json"), {
        "generator": "tests/tokenizer/make_fixtures.py", "cases": cases,
        "random_decodes": random_decodes(hf, hf.get_vocab_size(), list(range(259, hf.get_vocab_size())), rng, count=40)})


def smollm2_ids_only(model_path):
    """Without transformers (and torch, which its GGUF reader needs): makes the
    committed tokenizer.json's pre-tokenizer faithful and recomputes every id list
    of smollm2.json with HF `tokenizers` alone. Texts, decodes, chat renderings
    and random decodes do not depend on the pre-tokenizer and are kept; the hard
    strings are taken from HARD (new ones get their ids and decodes)."""
    from tokenizers import Tokenizer as HfTokenizer
    out_dir = os.path.join(ROOT, "tests/fixtures/smollm2-tokenizer")
    fast = HfTokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    pre_tokenizer = make_pre_tokenizer_faithful(fast, gguf_pre_name(model_path))
    fast.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    print("wrote", os.path.relpath(os.path.join(out_dir, "tokenizer.json"), ROOT))
    path = os.path.join(ROOT, "tests/tokenizer/fixtures/smollm2.json")
    with open(path, encoding="utf-8") as f:
        fixtures = json.load(f)
    fixtures = {k: v for kv in fixtures.items() if kv[0] != "pre_tokenizer"
                for k, v in ([kv, ("pre_tokenizer", pre_tokenizer)] if kv[0] == "model" else [kv])}
    fixtures["prompts"] = encode_cases(fast, [c["text"] for c in fixtures["prompts"]])
    fixtures["hard"] = encode_cases(fast, HARD)
    fixtures = {k: v for kv in fixtures.items() if kv[0] != "generated"
                for k, v in ([kv, ("generated", encode_cases(fast, generated_strings()))]
                             if kv[0] == "hard" else [kv])}
    for r in fixtures["chat"]["smollm2"]:
        if "text" in r:
            r["ids"] = fast.encode(r["text"], add_special_tokens=False).ids
    write_json(path, fixtures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="SmolLM2 GGUF (default: scripts/fetch-model)")
    parser.add_argument("--ids-only", action="store_true",
                        help="SmolLM2 only, with `tokenizers` + `gguf` (no transformers/torch): "
                             "fix the pre-tokenizer of the committed tokenizer.json and recompute "
                             "the ids of smollm2.json")
    args = parser.parse_args()
    model = args.model or subprocess.check_output(
        [os.path.join(ROOT, "scripts/fetch-model")], text=True).strip()
    if args.ids_only:
        smollm2_ids_only(model)
        return
    rng = random.Random(1234)
    smollm2(model, rng)
    spm_tiny(rng)


if __name__ == "__main__":
    main()
