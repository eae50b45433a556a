#!/usr/bin/env python3
"""`pagedserve generate` on the random-weight Llama.

    generate_cli_test.py PAGEDSERVE MODEL_DIR REFERENCE_JSON

Greedy output (plain prompt, stdin prompt, chat prompt) must be a prefix of
the transformers reference text of that prompt (tests/fixtures/random_llama/
reference.json, greedy_text); a stop string taken from the reference text must
cut the output right before it; bad input must exit non-zero with a message
naming the problem.
"""

import json
import re
import subprocess
import sys
import tempfile


def run(binary, args, stdin=None):
    p = subprocess.run([binary, "generate"] + args, input=stdin, capture_output=True, timeout=240)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8")


def main():
    binary, model, ref_path = sys.argv[1:4]
    with open(ref_path, encoding="utf-8") as f:
        ref = {p["name"]: p for p in json.load(f)["prompts"]}
    failures = []

    def check(cond, what):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            failures.append(what)

    plain = ref["plain_english"]
    common = ["--model", model, "--temperature", "0", "--ignore-eos", "--kv-cache-memory", str(32 << 20),
              "--swap-space", "0"]

    rc, out, err = run(binary, common + ["--prompt", plain["text"], "--max-tokens", "8"])
    check(rc == 0, f"plain prompt exits 0 (rc={rc}, stderr={err.strip()!r})")
    check(len(out) > 0 and plain["greedy_text"].startswith(out),
          f"plain output {out!r} is a prefix of the reference {plain['greedy_text']!r}")
    check("completion_tokens=8" in err and "finish_reason=length" in err, f"usage line on stderr: {err.strip()!r}")

    # Underscored flag names and the prompt on stdin give the same text.
    args2 = [a.replace("--max-tokens", "--max_tokens") for a in common + ["--max-tokens", "8"]]
    rc2, out2, err2 = run(binary, args2, stdin=plain["text"].encode("utf-8"))
    check(rc2 == 0 and out2 == out, f"stdin prompt with --max_tokens gives the same text ({out2!r}, rc={rc2})")

    # A stop string from the reference text spanning tokens.
    text = plain["greedy_text"]
    stop = text[10:16]
    want = text[:text.find(stop)]
    rc, out, err = run(binary, common + ["--prompt", plain["text"], "--max-tokens", "16", "--stop", "zzzz",
                                         "--stop", stop])
    check(rc == 0 and out == want, f"--stop {stop!r}: output {out!r}, want {want!r}")
    check("finish_reason=stop" in err, f"stop finish reason on stderr: {err.strip()!r}")

    # Chat: the prompt as one user message through the model's template.
    chat = ref["chat_single"]
    rc, out, err = run(binary, common + ["--chat", "--prompt", chat["messages"][0]["content"], "--max-tokens", "6"])
    check(rc == 0 and len(out) > 0 and chat["greedy_text"].startswith(out),
          f"--chat output {out!r} is a prefix of the reference {chat['greedy_text']!r} (rc={rc}, {err.strip()!r})")

    # n = 2 with a seed: two samples.
    rc, out, err = run(binary, ["--model", model, "--prompt", "Hello", "--n", "2", "--seed", "3", "--max-tokens", "4",
                                "--kv-cache-memory", str(32 << 20), "--swap-space", "0"])
    check(rc == 0 and "[sample 0]" in out and "[sample 1]" in out and "completion_tokens=8" in err,
          f"--n 2 prints both samples (rc={rc}, {err.strip()!r})")

    # Errors.
    rc, out, err = run(binary, ["--model", "/nonexistent/model.gguf", "--prompt", "x"])
    check(rc != 0 and "does not exist" in err, f"missing model: rc={rc}, stderr={err.strip()!r}")
    rc, out, err = run(binary, ["--model", model, "--prompt", "x", "--top-p", "1.5"])
    check(rc == 2 and "top-p" in err, f"--top-p 1.5: rc={rc}, stderr={err.strip()!r}")
    rc, out, err = run(binary, ["--model", model, "--prompt", ref["long"]["text"], "--max-model-len", "64",
                                "--kv-cache-memory", str(32 << 20)])
    check(rc == 2 and "max_model_len" in err, f"prompt over --max-model-len rejected: rc={rc}, stderr={err.strip()!r}")
    # prompt + max_tokens over --max-model-len: a given --max-tokens is refused naming it; the
    # default (16) is lowered to the room, so prompt + completion fill the 8-token context.
    tiny = ["--model", model, "--prompt", "x", "--max-model-len", "8", "--kv-cache-memory", str(32 << 20),
            "--temperature", "0", "--ignore-eos"]
    rc, out, err = run(binary, tiny + ["--max-tokens", "16"])
    check(rc == 2 and "max_tokens (16) is too large" in err,
          f"--max-tokens beyond the context refused: rc={rc}, stderr={err.strip()!r}")
    rc, out, err = run(binary, ["--model", model, "--prompt", "x", "--max-model-len", "8", "--kv-cache-memory",
                                str(32 << 20), "--n", "2", "--max-tokens", "16"])
    check(rc == 2 and out == "" and "max_tokens (16) is too large" in err,
          f"a refused n = 2 request prints no sample headers: rc={rc}, stdout={out!r}, stderr={err.strip()!r}")
    rc, out, err = run(binary, tiny)
    counts = dict(re.findall(r"\b(prompt_tokens|completion_tokens)=(\d+)", err))
    check(rc == 0 and "finish_reason=length" in err and
          int(counts.get("prompt_tokens", 0)) + int(counts.get("completion_tokens", 0)) == 8,
          f"default --max-tokens lowered to the room: rc={rc}, stderr={err.strip()!r}")
    # A bad draft model is refused before the target loads (no "Loading weights" line).
    with tempfile.TemporaryDirectory() as empty:
        for draft, says in (("/nonexistent/draft.gguf", "does not exist"), (empty, "is not a model")):
            spec = json.dumps({"model": draft, "num_speculative_tokens": 2})
            rc, out, err = run(binary, ["--model", model, "--prompt", "x", "--speculative-config", spec])
            check(rc != 0 and "--speculative-config: draft model" in err and says in err
                  and "Loading weights" not in err,
                  f"draft model {draft!r} refused before the target loads: rc={rc}, stderr={err.strip()!r}")
    rc, out, err = run(binary, ["--model", model, "--prompt", "x", "--block-size", "7"])
    check(rc == 2 and "--block-size" in err, f"--block-size 7: rc={rc}, stderr={err.strip()!r}")
    rc, out, err = run(binary, ["--model", model, "stray"])
    check(rc == 2 and "unexpected argument" in err, f"stray argument: rc={rc}, stderr={err.strip()!r}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
