#!/usr/bin/env python3
"""Regenerates the tokenizer reference fixtures with Hugging Face transformers /
tokenizers (nobody here wrote them).

    scripts/install-deps --reference
    python3 tests/tokenizer/make_fixtures.py [--model PATH.gguf]

Writes (committed):
  tests/fixtures/smollm2-tokenizer/tokenizer.json, tokenizer_config.json
      SmolLM2's tokenizer as transformers builds it from the GGUF.
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
]


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
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": gguf_template,
        "prompts": encode_cases(tok, PROMPTS),
        "hard": encode_cases(tok, HARD),
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="SmolLM2 GGUF (default: scripts/fetch-model)")
    args = parser.parse_args()
    model = args.model or subprocess.check_output(
        [os.path.join(ROOT, "scripts/fetch-model")], text=True).strip()
    rng = random.Random(1234)
    smollm2(model, rng)
    spm_tiny(rng)


if __name__ == "__main__":
    main()
