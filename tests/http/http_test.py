#!/usr/bin/env python3
"""The OpenAI-compatible HTTP API of `pagedserve serve` (docs/http.md), end to end.

Starts a real server on the default model (SmolLM2-135M-Instruct GGUF) with the HTTP
API on a free port and talks to it with the official `openai` package and with curl:
chat and completions, streaming and not, n = 2, stop strings, logprobs, seed
reproducibility, usage totals, a client that closes a stream mid-way (its KV blocks
come back), SSE framing, error statuses, the API key, and health / models / metrics
answering while a 2,000-token prompt is being prefilled. Greedy decoding is
deterministic, which the equality checks rely on.

  http_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL.gguf [-k PATTERN]
"""
import argparse
import http.client as httpclient
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

try:
    import openai
except ImportError:  # scripts/install-deps installs it
    print("http_test: the 'openai' package is missing (pip install openai); skipping")
    sys.exit(77)

ARGS = None
SERVER = None
MAX_MODEL_LEN = 2304


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`pagedserve serve` with the HTTP API on a free port; stop() sends SIGTERM."""

    def __init__(self, extra=(), env_extra=None, ssl_context=None, model=None):
        """ssl_context: the server runs with --ssl-certfile; health checks trust this context.
        model: a model path other than --model."""
        model = model or ARGS.model
        self.zmq = f"tcp://127.0.0.1:{free_port()}"
        cmd = [ARGS.pagedserve, "serve", f"--model={model}", f"--zmq-endpoint={self.zmq}", "--port=0",
               f"--max-model-len={MAX_MODEL_LEN}", "--kv-cache-memory=134217728",
               "--max-num-batched-tokens=512"] + list(extra)
        env = dict(os.environ)
        env.update(env_extra or {})
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.url = None
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            m = re.search(r"HTTP API on (https?://[0-9.]+:\d+)", self.logs())
            if m and self.url is None:
                self.url = m.group(1)
            if self.url is not None:
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=5, context=ssl_context) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
            time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"server not healthy in time:\n{self.logs()}")
        self.model = os.path.basename(model.rstrip("/"))

    def logs(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def http(method, url, body=None, headers=None, timeout=60, context=None):
    """(status, parsed JSON or text) without raising on 4xx/5xx; context: an ssl.SSLContext for https."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def metric(url, name, labels=""):
    _, text = http("GET", url + "/metrics")
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if labels in line:
                total += float(line.rsplit(" ", 1)[1])
                found = True
    assert found, f"{name} {labels} not in /metrics"
    return total


def wait_blocks_free(url, timeout=30):
    """Device KV usage and running/waiting requests back to 0 (one step after the last request)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (metric(url, "pagedserve_kv_cache_usage_ratio", 'pool="device"') == 0 and
                metric(url, "pagedserve_requests_running") == 0 and metric(url, "pagedserve_requests_waiting") == 0):
            return True
        time.sleep(0.05)
    return False


def curl(*args):
    out = subprocess.run(["curl", "-s", "-S", "--max-time", "120", *args], capture_output=True, timeout=180)
    return out.stdout.decode("utf-8", "replace")


class OpenAiClientTest(unittest.TestCase):
    def setUp(self):
        self.c = SERVER.client()
        self.m = SERVER.model

    def tokenize(self, text, add_special_tokens=True):
        status, body = http("POST", SERVER.url + "/tokenize", {"prompt": text,
                                                               "add_special_tokens": add_special_tokens})
        self.assertEqual(status, 200, body)
        return body["tokens"]

    def test_models_health_version(self):
        models = self.c.models.list()
        self.assertEqual([m.id for m in models.data], [self.m])
        self.assertEqual(http("GET", SERVER.url + "/health")[0], 200)
        status, body = http("GET", SERVER.url + "/version")
        self.assertEqual(status, 200)
        self.assertRegex(body["version"], r"^\d+\.\d+\.\d+$")

    def test_completion_usage_and_token_id_prompt(self):
        prompt = "The capital of France is"
        r = self.c.completions.create(model=self.m, prompt=prompt, max_tokens=8, temperature=0)
        self.assertEqual(len(r.choices), 1)
        self.assertTrue(r.choices[0].text)
        ids = self.tokenize(prompt)
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        if r.choices[0].finish_reason == "length":
            self.assertEqual(r.usage.completion_tokens, 8)
        # The same prompt as token ids gives the same greedy text.
        r2 = self.c.completions.create(model=self.m, prompt=ids, max_tokens=8, temperature=0)
        self.assertEqual(r2.choices[0].text, r.choices[0].text)
        # /detokenize inverts /tokenize (without the special tokens).
        status, body = http("POST", SERVER.url + "/detokenize", {"tokens": self.tokenize(prompt, False)})
        self.assertEqual((status, body["prompt"]), (200, prompt))

    def test_list_of_prompts(self):
        r = self.c.completions.create(model=self.m, prompt=["One, two,", "Red, green,"], max_tokens=4,
                                      temperature=0)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        single = self.c.completions.create(model=self.m, prompt="Red, green,", max_tokens=4, temperature=0)
        self.assertEqual(r.choices[1].text, single.choices[0].text)
        self.assertEqual(r.usage.prompt_tokens, len(self.tokenize("One, two,")) + len(self.tokenize("Red, green,")))

    def test_chat_stream_equals_non_stream(self):
        msgs = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}]
        full = self.c.chat.completions.create(model=self.m, messages=msgs, max_tokens=24, temperature=0)
        self.assertEqual(full.object, "chat.completion")
        self.assertEqual(full.choices[0].message.role, "assistant")
        text = full.choices[0].message.content
        self.assertTrue(text)
        chunks = list(self.c.chat.completions.create(model=self.m, messages=msgs, max_tokens=24, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(streamed, text)
        finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(finals, [full.choices[0].finish_reason])
        # include_usage: one last chunk with empty choices and the totals.
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, full.usage.prompt_tokens)
        self.assertTrue(all(ch.usage is None for ch in chunks[:-1]))

    def test_completion_stream(self):
        full = self.c.completions.create(model=self.m, prompt="Once upon a time", max_tokens=12, temperature=0)
        chunks = list(self.c.completions.create(model=self.m, prompt="Once upon a time", max_tokens=12,
                                                temperature=0, stream=True))
        self.assertEqual("".join(ch.choices[0].text for ch in chunks), full.choices[0].text)
        self.assertEqual(chunks[-1].choices[0].finish_reason, full.choices[0].finish_reason)

    def test_n2_and_seed_reproducibility(self):
        kw = dict(model=self.m, prompt="My favourite animal is", max_tokens=10, temperature=1.0, n=2)
        a = self.c.completions.create(seed=1234, **kw)
        b = self.c.completions.create(seed=1234, **kw)
        self.assertEqual(sorted(c.index for c in a.choices), [0, 1])
        self.assertEqual([c.text for c in a.choices], [c.text for c in b.choices])
        self.assertTrue(2 <= a.usage.completion_tokens <= 20, a.usage)
        others = [self.c.completions.create(seed=s, **kw).choices[0].text for s in (1, 2, 3)]
        self.assertTrue(any(t != a.choices[0].text for t in others), "different seeds gave identical samples")

    def test_stop_string(self):
        base = self.c.completions.create(model=self.m, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
        self.assertGreater(len(base), 6, base)
        stop = base[3:6]
        r = self.c.completions.create(model=self.m, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0,
                                      stop=[stop])
        self.assertEqual(r.choices[0].text, base[:base.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_logprobs_both_formats(self):
        r = self.c.completions.create(model=self.m, prompt="Hello", max_tokens=5, temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), r.usage.completion_tokens)
        self.assertEqual(len(lp.token_logprobs), len(lp.tokens))
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs))
        for tok, x, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(len(top), 2)
            # Greedy: the sampled token is the best one.
            self.assertAlmostEqual(max(top.values()), x, places=4)
        c = self.c.chat.completions.create(model=self.m, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
        content = c.choices[0].logprobs.content
        self.assertEqual(len(content), c.usage.completion_tokens)
        for e in content:
            self.assertEqual(bytes(e.bytes).decode("utf-8", "replace"), e.token)
            self.assertEqual(len(e.top_logprobs), 3)
            self.assertAlmostEqual(e.top_logprobs[0].logprob, e.logprob, places=4)

    def test_prompt_logprobs(self):
        """vLLM's prompt_logprobs: the token each step generates, fed back as
        the prompt's last token, is scored with the logprob generation gave it."""
        r = self.c.completions.create(model=self.m, prompt="The capital of France is", max_tokens=1,
                                      temperature=0, logprobs=1)
        status, tok = http("POST", SERVER.url + "/tokenize", {"model": self.m, "prompt": "The capital of France is"})
        self.assertEqual(status, 200, tok)
        ids = tok["tokens"]
        status, nxt = http("POST", SERVER.url + "/tokenize",
                           {"model": self.m, "prompt": r.choices[0].text, "add_special_tokens": False})
        self.assertEqual(status, 200, nxt)
        prompt = ids + nxt["tokens"][:1]
        p = self.c.completions.create(model=self.m, prompt=prompt, max_tokens=1, temperature=0, n=2,
                                      extra_body={"prompt_logprobs": 3})
        for choice in p.choices:
            lps = choice.model_extra["prompt_logprobs"]
            self.assertEqual(len(lps), len(prompt))
            self.assertIsNone(lps[0])
            for i, entry in enumerate(lps[1:], start=1):
                self.assertIn(str(prompt[i]), entry)
                self.assertIn(len(entry), (3, 4))  # the top 3, plus the token when outside them
                mine = entry[str(prompt[i])]
                self.assertLessEqual(mine["logprob"], 0)
                ranks = sorted(e["rank"] for e in entry.values())
                self.assertEqual(ranks[:3], [1, 2, 3])
            last = lps[-1][str(prompt[-1])]
            self.assertEqual(last["rank"], 1)  # greedy picked it
            self.assertAlmostEqual(last["logprob"], r.choices[0].logprobs.token_logprobs[0], places=2)
        c = self.c.chat.completions.create(model=self.m, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=1, extra_body={"prompt_logprobs": 0})
        lps = c.model_extra["prompt_logprobs"]
        self.assertEqual(len(lps), c.usage.prompt_tokens)
        self.assertTrue(all(len(e) == 1 for e in lps[1:]))
        status, body = http("POST", SERVER.url + "/v1/completions",
                            {"model": self.m, "prompt": "x", "prompt_logprobs": 1, "stream": True})
        self.assertEqual((status, body["error"]["param"]), (400, "prompt_logprobs"), body)

    def test_beam_search_extra_body(self):
        # vLLM's extra body fields; n = 2 of 3 beams, best first, all of
        # length 6 (ignore_eos), so the first has the higher cumulative logprob.
        kw = dict(model=self.m, prompt="The capital of France is", max_tokens=6, n=2, logprobs=0)
        extra = {"use_beam_search": True, "best_of": 3, "ignore_eos": True, "length_penalty": 1.0,
                 "early_stopping": "never"}
        r = self.c.completions.create(extra_body=extra, **kw)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        by_index = sorted(r.choices, key=lambda c: c.index)
        sums = [sum(c.logprobs.token_logprobs) for c in by_index]
        self.assertTrue(all(len(c.logprobs.token_logprobs) == 6 for c in by_index))
        self.assertGreaterEqual(sums[0], sums[1])
        self.assertNotEqual(by_index[0].logprobs.tokens, by_index[1].logprobs.tokens)
        self.assertEqual(r.usage.completion_tokens, 12)
        # Streamed: the same beams, sent when the search ends.
        chunks = list(self.c.completions.create(stream=True, extra_body=extra, **kw))
        texts = {}
        for ch in chunks:
            for c in ch.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        self.assertEqual(texts, {c.index: c.text for c in r.choices})
        with self.assertRaises(openai.BadRequestError) as e:
            self.c.completions.create(model=self.m, prompt="x", max_tokens=2, n=2, temperature=1.0,
                                      extra_body={"use_beam_search": True})
        self.assertIn("temperature must be 0", str(e.exception))

    def test_logit_processors_and_output_options(self):
        """Issue 32: logit_bias, min_tokens, bad_words, include_stop_str_in_output, echo,
        skip_special_tokens, each against the same greedy request without it."""
        kw = dict(model=self.m, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0)
        base = self.c.completions.create(**kw, logprobs=0, extra_body={"ignore_eos": True}).choices[0]
        first = self.tokenize(base.logprobs.tokens[0], add_special_tokens=False)
        self.assertEqual(len(first), 1, base.logprobs.tokens)
        # logit_bias -100 on the greedy first token: another token comes first.
        r = self.c.completions.create(**kw, logprobs=0, logit_bias={str(first[0]): -100},
                                      extra_body={"ignore_eos": True}).choices[0]
        self.assertNotEqual(r.logprobs.tokens[0], base.logprobs.tokens[0])
        # +100 on a token the model would not choose makes it every token.
        forced = self.tokenize(" banana", add_special_tokens=False)[0]
        r = self.c.completions.create(**kw, logit_bias={str(forced): 100}).choices[0]
        self.assertEqual(r.text, " banana" * 8)
        # bad_words: the greedy continuation's first word never appears.
        word = base.text.split()[0]
        r = self.c.completions.create(**kw, extra_body={"bad_words": [word], "ignore_eos": True}).choices[0]
        self.assertNotEqual(r.text.split()[0] if r.text.split() else "", word)
        self.assertNotEqual(r.text, base.text)
        # include_stop_str_in_output keeps the stop string; min_tokens past it ignores it.
        stop = base.text[3:6]
        cut = base.text.index(stop)
        r = self.c.completions.create(**kw, stop=[stop], extra_body={"include_stop_str_in_output": True})
        self.assertEqual(r.choices[0].text, base.text[:cut + len(stop)])
        r = self.c.completions.create(**kw, stop=[stop], extra_body={"min_tokens": 8, "ignore_eos": True})
        self.assertEqual(r.choices[0].text, base.text)
        self.assertEqual(r.choices[0].finish_reason, "length")
        # min_tokens masks EOS: a chat that ends early runs to min_tokens.
        msgs = [{"role": "user", "content": "Say OK."}]
        short = self.c.chat.completions.create(model=self.m, messages=msgs, max_tokens=64, temperature=0)
        self.assertEqual(short.choices[0].finish_reason, "stop")
        n = short.usage.completion_tokens + 5
        longer = self.c.chat.completions.create(model=self.m, messages=msgs, max_tokens=64, temperature=0,
                                                extra_body={"min_tokens": n})
        self.assertGreaterEqual(longer.usage.completion_tokens, n)
        # echo: the prompt first, streamed and not.
        r = self.c.completions.create(**kw, echo=True, extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, kw["prompt"] + base.text)
        chunks = list(self.c.completions.create(**kw, echo=True, stream=True,
                                                extra_body={"ignore_eos": True}))
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), kw["prompt"] + base.text)
        # skip_special_tokens false: the chat template's end token shows in the text.
        ids = self.tokenize("<|im_end|>", add_special_tokens=False)
        self.assertEqual(len(ids), 1)
        r = self.c.completions.create(model=self.m, prompt="Hi", max_tokens=2, temperature=0,
                                      logit_bias={str(ids[0]): 100},
                                      extra_body={"skip_special_tokens": False, "ignore_eos": True})
        self.assertIn("<|im_end|>", r.choices[0].text)
        # Known, not implemented: a 400 naming the field.
        for field, value in [("suffix", "x")]:
            status, body = http("POST", SERVER.url + "/v1/completions",
                                {"model": self.m, "prompt": "x", field: value})
            self.assertEqual((status, body["error"]["param"]), (400, field), body)
        status, body = http("POST", SERVER.url + "/v1/completions",
                            {"model": self.m, "prompt": "x", "echo": True, "logprobs": 1, "stream": True})
        self.assertEqual((status, body["error"]["param"]), (400, "echo"), body)
        # echo + logprobs as lm-evaluation-harness asks for a loglikelihood: the
        # prompt's tokens first (null first), then the generated one.
        e = self.c.completions.create(model=self.m, prompt="The capital of France is", echo=True,
                                      logprobs=1, max_tokens=1, temperature=0)
        lp = e.choices[0].logprobs
        self.assertEqual(len(lp.tokens), e.usage.prompt_tokens + 1)
        self.assertEqual("".join(lp.tokens), e.choices[0].text)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs[1:]))
        self.assertEqual(lp.text_offset[0], 0)
        for tok, top in zip(lp.tokens[1:], lp.top_logprobs[1:]):
            self.assertIn(tok, top)
        # An unknown field is ignored, and one warning line names it (vLLM's behaviour).
        status, body = http("POST", SERVER.url + "/v1/completions",
                            {"model": self.m, "prompt": "x", "max_tokens": 1, "zeta_unknown_field": 1})
        self.assertEqual(status, 200, body)
        self.assertRegex(SERVER.logs(), r"warn.*\"zeta_unknown_field\"")

    def test_tools_through_the_sdk(self):
        """Issue 32: tools / tool_choice / tool history through the official client, streamed
        and not (the SmolLM2 template renders no tools; what is parsed is the model's text)."""
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]
        msgs = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_abc", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "21 C, clear"}]
        kw = dict(model=self.m, messages=msgs, tools=tools, max_tokens=12, temperature=0)
        r = self.c.chat.completions.create(tool_choice="auto", **kw)
        choice = r.choices[0]
        self.assertIn(choice.finish_reason, ("stop", "length", "tool_calls"))
        for call in choice.message.tool_calls or []:
            self.assertTrue(call.id.startswith("call_"))
            json.loads(call.function.arguments)
        text = "".join(c.choices[0].delta.content or "" for c in
                       self.c.chat.completions.create(tool_choice="auto", stream=True, **kw) if c.choices)
        if not choice.message.tool_calls:
            self.assertEqual(text, choice.message.content)
        none = self.c.chat.completions.create(tool_choice="none", **kw).choices[0]
        self.assertIsNone(none.message.tool_calls)
        # required / named are constrained (structured_output_test.py); a name that is not a
        # tool, or a second constraint, is a 400 naming tool_choice.
        with self.assertRaises(openai.BadRequestError) as e:
            self.c.chat.completions.create(
                tool_choice={"type": "function", "function": {"name": "get_time"}}, **kw)
        self.assertIn("tool_choice", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.c.chat.completions.create(tool_choice="required", response_format={"type": "json_object"},
                                           **kw)
        self.assertIn("tool_choice", str(e.exception))

    def test_errors_through_the_sdk(self):
        with self.assertRaises(openai.NotFoundError):
            self.c.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        with self.assertRaises(openai.BadRequestError) as e:
            self.c.completions.create(model=self.m, prompt="x", max_tokens=1, temperature=-1)
        self.assertIn("temperature", str(e.exception))
        with self.assertRaises(openai.BadRequestError):
            self.c.completions.create(model=self.m, prompt=[1] * MAX_MODEL_LEN, max_tokens=1)


class CurlTest(unittest.TestCase):
    def test_sse_framing(self):
        body = json.dumps({"model": SERVER.model, "prompt": "Hi", "max_tokens": 4, "temperature": 0,
                           "stream": True})
        out = curl("-N", "-H", "Content-Type: application/json", "-d", body, SERVER.url + "/v1/completions")
        self.assertTrue(out.endswith("data: [DONE]\n\n"), repr(out[-200:]))
        events = out.split("\n\n")[:-1]
        self.assertGreaterEqual(len(events), 2)
        for ev in events:
            self.assertTrue(ev.startswith("data: "), repr(ev))
            self.assertNotIn("\n", ev)
        for ev in events[:-1]:
            chunk = json.loads(ev[len("data: "):])
            self.assertEqual(chunk["object"], "text_completion")

    def status(self, *args):
        out = curl("-o", "/dev/null", "-w", "%{http_code}", *args)
        return int(out)

    def test_error_statuses(self):
        u = SERVER.url
        js = ["-H", "Content-Type: application/json"]
        self.assertEqual(self.status(*js, "-d", "{not json", u + "/v1/completions"), 400)
        self.assertEqual(self.status(*js, "-d", '{"prompt": "x", "max_tokens": "many"}', u + "/v1/completions"), 400)
        self.assertEqual(self.status(*js, "-d", '{"messages": "hi"}', u + "/v1/chat/completions"), 400)
        self.assertEqual(self.status(*js, "-d", '{"prompt": "x", "model": "other"}', u + "/v1/completions"), 404)
        self.assertEqual(self.status(u + "/v1/nothing"), 404)
        big = tempfile.NamedTemporaryFile(delete=False)
        big.write(b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
        big.close()
        self.assertEqual(self.status(*js, "--data-binary", "@" + big.name, u + "/v1/completions"), 413)
        # Chunked bodies are read under the same bound (cpp-httplib 0.11 would
        # read them whole): over it 413, on every route; a small one is served.
        for route in ("/v1/completions", "/tokenize"):
            self.assertEqual(self.status(*js, "-H", "Transfer-Encoding: chunked", "--data-binary",
                                         "@" + big.name, u + route), 413, route)
        os.unlink(big.name)
        small = {"prompt": "a  12 apples", "add_special_tokens": False}
        out = curl("-H", "Content-Type: application/json", "-H", "Transfer-Encoding: chunked",
                   "-d", json.dumps(small), u + "/tokenize")
        self.assertEqual(json.loads(out), http("POST", u + "/tokenize", small)[1], out)
        # A Content-Length beyond the limit is answered from the header alone
        # (no body follows here: waiting for it would time out).
        self.assertEqual(self.status(*js, "-H", "Content-Length: 999999999999", "-d", "{}", "-m", "10",
                                     u + "/v1/completions"), 413)
        status, body = http("POST", u + "/v1/completions", {"prompt": "x", "n": 0})
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertEqual(body["error"]["param"], "n")
        # Unknown fields are ignored, as the OpenAI API does.
        status, body = http("POST", u + "/v1/completions", {"prompt": "x", "max_tokens": 1, "frobnicate": 3,
                                                            "user": "someone"})
        self.assertEqual(status, 200, body)
        # A chat request whose n samples could each use the rest of the context (no
        # max_tokens) and that the KV cache could never hold: refused naming n.
        status, body = http("POST", u + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "n": 32})
        self.assertEqual((status, body["error"]["param"]), (400, "n"), body)
        self.assertIn("max_tokens was not given", body["error"]["message"])
        status, body = http("POST", u + "/v1/completions",
                            {"prompt": "x", "stream_options": {"include_usage": True}})
        self.assertEqual((status, body["error"]["param"]), (400, "stream_options"), body)
        status, body = http("POST", u + "/v1/completions", b'{"prompt": "x", "n": tru}')
        self.assertEqual(status, 400)
        self.assertIn("line 1, column", body["error"]["message"])
        # A body nested 200,000 levels deep (400 KB) once ended the process (a
        # recursive JSON copy overflowed the handler's stack): 400, still serving.
        before = metric(u, "pagedserve_http_responses_total", 'status="400"')
        deep = b'{"messages": [{"role": "user", "content": ' + b"[" * 200000 + b"]" * 200000 + b"}]}"
        status, body = http("POST", u + "/v1/chat/completions", deep)
        self.assertEqual(status, 400)
        self.assertIn("JSON nests deeper than 32 levels", body["error"]["message"])
        status, body = http("POST", u + "/v1/completions", {"prompt": "x", "max_tokens": 1})
        self.assertEqual(status, 200, body)
        # Every response is counted by status (the callback runs after the write).
        deadline = time.time() + 10
        while metric(u, "pagedserve_http_responses_total", 'status="400"') < before + 1:
            self.assertLess(time.time(), deadline)
            time.sleep(0.05)


class AbortAndLatencyTest(unittest.TestCase):
    def test_client_closing_a_stream_frees_its_blocks(self):
        c = SERVER.client()
        before = metric(SERVER.url, "pagedserve_requests_finished_total", 'finish_reason="abort"')
        stream = c.completions.create(model=SERVER.model, prompt="Count: 1, 2, 3,", max_tokens=1500,
                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
        got = 0
        for _ in stream:
            got += 1
            if got == 3:
                break
        self.assertGreater(metric(SERVER.url, "pagedserve_kv_cache_usage_ratio", 'pool="device"'), 0)
        stream.close()  # closes the connection mid-stream
        self.assertTrue(wait_blocks_free(SERVER.url), SERVER.logs()[-2000:])
        self.assertEqual(metric(SERVER.url, "pagedserve_requests_finished_total", 'finish_reason="abort"'),
                         before + 1)
        self.assertRegex(SERVER.logs(), r"request http: id=\"cmpl-[0-9a-f]+\" .*finish_reason=abort "
                                        r".*client_disconnected")

    def test_non_streaming_client_that_hangs_up_is_aborted(self):
        body = json.dumps({"prompt": "Count: 1, 2, 3,", "max_tokens": 1500, "ignore_eos": True})
        before = metric(SERVER.url, "pagedserve_requests_finished_total", 'finish_reason="abort"')
        p = subprocess.Popen(["curl", "-s", "-H", "Content-Type: application/json", "-d", body,
                              SERVER.url + "/v1/completions"], stdout=subprocess.DEVNULL)
        deadline = time.time() + 60
        while metric(SERVER.url, "pagedserve_kv_cache_usage_ratio", 'pool="device"') == 0:
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        p.kill()
        p.wait()
        self.assertTrue(wait_blocks_free(SERVER.url))
        self.assertEqual(metric(SERVER.url, "pagedserve_requests_finished_total", 'finish_reason="abort"'),
                         before + 1)

    def test_health_and_stats_answer_during_a_long_prefill(self):
        ids = http("POST", SERVER.url + "/tokenize", {"prompt": "The quick brown fox jumps over the lazy dog. " * 250,
                                                      "add_special_tokens": False})[1]["tokens"][:2000]
        self.assertEqual(len(ids), 2000)
        aborts = metric(SERVER.url, "pagedserve_requests_finished_total", 'finish_reason="abort"')
        host, port = SERVER.url[len("http://"):].split(":")
        conn = httpclient.HTTPConnection(host, int(port), timeout=600)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": ids, "max_tokens": 1, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()  # headers come at once; the first event after the prefill
        self.assertEqual(resp.status, 200)
        first = {}

        def read_first_event():
            try:
                first["line"] = resp.readline()
            except Exception:  # the test closes the socket under it
                pass
            first["t"] = time.monotonic()

        reader = threading.Thread(target=read_first_event)
        reader.start()
        # Wait for the engine to take the request (running, or its blocks held):
        # from then on it is prefilling.
        deadline = time.time() + 60
        while (metric(SERVER.url, "pagedserve_requests_running") < 1
               and metric(SERVER.url, "pagedserve_kv_cache_usage_ratio", 'pool="device"') == 0):
            self.assertLess(time.time(), deadline, "the request never started")
            time.sleep(0.01)
        latencies = []
        for path in ["/health", "/v1/models", "/metrics", "/health", "/version"]:
            s = time.monotonic()
            status, _ = http("GET", SERVER.url + path)
            latencies.append(time.monotonic() - s)
            self.assertEqual(status, 200, path)
        # Order: every probe was answered while the prefill was still running ...
        self.assertNotIn("t", first, "the prefill ended before the probes: the test proves nothing")
        print(f"probe latencies during a 2000-token prefill (ms): {[round(x * 1000, 1) for x in latencies]}",
              file=sys.stderr)
        # ... and quickly (generous bound for a loaded 2-core CI machine; the target is 50 ms).
        self.assertLess(max(latencies), 0.5)
        # Hang up: the request is aborted after the prefill chunk in progress; its blocks come back.
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        reader.join()
        deadline = time.time() + 300
        while metric(SERVER.url, "pagedserve_requests_finished_total", 'finish_reason="abort"') < aborts + 1:
            self.assertLess(time.time(), deadline, "the hung-up request was not aborted")
            time.sleep(0.05)
        self.assertTrue(wait_blocks_free(SERVER.url))

    def test_slow_clients_do_not_queue_health(self):
        # 700 clients that send half a request line and stall (slowloris; an idle
        # keep-alive connection is the same to the server) hold their connections
        # until --http-timeout (30 s). With a fixed pool smaller than 700 (the old
        # one had max_num_seqs + max_queue_len + 32 = 544 threads here), /health
        # queued behind them and was answered only once the first of them timed
        # out. The check is an order, not a time: /health is answered while every
        # slow connection is still open.
        host, port = SERVER.url[len("http://"):].split(":")
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        except (ImportError, ValueError, OSError):
            pass
        slow = []
        try:
            for _ in range(700):
                s = socket.create_connection((host, int(port)), timeout=30)
                s.sendall(b"GET /heal")
                slow.append(s)
            time.sleep(0.5)  # the server has accepted and is reading every one of them
            status, body = http("GET", SERVER.url + "/health", timeout=120)
            self.assertEqual(status, 200, body)
            closed = []
            for i, s in enumerate(slow):  # still open: a read would block (no EOF, no reset)
                s.setblocking(False)
                try:
                    closed.append((i, s.recv(200)))
                except BlockingIOError:
                    pass
            self.assertEqual(closed, [], f"{len(closed)} slow connections were answered or closed before /health")
        finally:
            for s in slow:
                s.close()


class SecondServerTest(unittest.TestCase):
    """A server with an API key (from the environment), one running sequence and a waiting queue of one."""

    def test_api_key_and_queue_full(self):
        srv = ServerProcess(extra=["--max-model-len=256", "--max-num-seqs=1", "--max-queue-len=1"],
                            env_extra={"PAGEDSERVE_API_KEY": "s3cret"})
        try:
            self.check_api_key(srv)
            self.check_queue_full(srv)
        finally:
            self.assertEqual(srv.stop(), 0, srv.logs())

    def test_generation_config_out_of_range_is_refused_at_startup(self):
        # A default no request could send would fail every request that leaves
        # the field out; the server refuses to start, naming the file and field.
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "generation_config.json"), "w") as f:
                f.write('{"top_p": 5}')
            out = subprocess.run([ARGS.pagedserve, "serve", f"--model={ARGS.model}", "--port=0",
                                  f"--generation-config={d}"], capture_output=True, text=True,
                                 timeout=300)
            self.assertNotEqual(out.returncode, 0, out.stderr)
            self.assertIn(os.path.join(d, "generation_config.json"), out.stderr)
            self.assertIn("top_p must be in (0, 1], got 5", out.stderr)

    def test_priority_scheduling(self):
        # The default server (fcfs) refuses a non-zero priority, as vLLM does.
        status, body = http("POST", SERVER.url + "/v1/completions",
                            {"prompt": "x", "max_tokens": 1, "priority": 1})
        self.assertEqual((status, body["error"]["param"]), (400, "priority"), body)
        srv = ServerProcess(extra=["--max-model-len=256", "--max-num-seqs=1",
                                   "--scheduling-policy=priority"])
        try:
            c = srv.client()
            running = c.completions.create(model=srv.model, prompt="Count: 1, 2, 3,", max_tokens=200,
                                           stream=True, extra_body={"ignore_eos": True})
            next(iter(running))  # it holds the one sequence slot
            done = []
            lock = threading.Lock()

            def send(name, priority):
                r = c.completions.create(model=srv.model, prompt="Hi", max_tokens=2,
                                         extra_body={"priority": priority, "request_id": name})
                with lock:
                    done.append(r.id)

            low = threading.Thread(target=send, args=("low", 10))
            low.start()
            deadline = time.time() + 60
            while metric(srv.url, "pagedserve_requests_waiting") < 1:
                self.assertLess(time.time(), deadline)
                time.sleep(0.02)
            high = threading.Thread(target=send, args=("high", -10))
            high.start()
            while metric(srv.url, "pagedserve_requests_waiting") < 2:
                self.assertLess(time.time(), deadline)
                time.sleep(0.02)
            running.close()  # frees the slot: the later, more important request goes first
            low.join(60)
            high.join(60)
            self.assertEqual(done, ["cmpl-high", "cmpl-low"])
            self.assertTrue(wait_blocks_free(srv.url))
        finally:
            self.assertEqual(srv.stop(), 0, srv.logs())

    def check_queue_full(self, srv):
        c = srv.client(api_key="s3cret")
        kw = dict(model=srv.model, prompt="Count: 1, 2, 3,", max_tokens=200, stream=True,
                  extra_body={"ignore_eos": True})
        running = c.completions.create(**kw)
        next(iter(running))  # it runs (max-num-seqs 1) ...
        waiting = c.completions.create(**kw)  # ... this one waits (the queue holds 1) ...
        deadline = time.time() + 60
        while metric(srv.url, "pagedserve_requests_waiting") < 1:
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        with self.assertRaises(openai.RateLimitError) as e:  # ... and this one is refused: 429
            c.completions.create(model=srv.model, prompt="x", max_tokens=1)
        self.assertIn("queue is full", str(e.exception))
        running.close()
        waiting.close()
        self.assertTrue(wait_blocks_free(srv.url))

    def check_api_key(self, srv):
        u = srv.url
        self.assertEqual(http("GET", u + "/v1/models")[0], 401)
        status, body = http("GET", u + "/v1/models", headers={"Authorization": "Bearer wrong"})
        self.assertEqual((status, body["error"]["code"]), (401, "invalid_api_key"))
        self.assertEqual(http("GET", u + "/v1/models", headers={"Authorization": "Bearer s3cret"})[0], 200)
        # The scheme is case-insensitive (RFC 9110 11.1).
        self.assertEqual(http("GET", u + "/v1/models", headers={"Authorization": "bearer s3cret"})[0], 200)
        self.assertEqual(http("GET", u + "/v1/models", headers={"Authorization": "Bearer s3cret2"})[0], 401)
        # Two Authorization headers are refused even when one holds the key
        # (ambiguous: a proxy in front could have checked the other one).
        for pair in (("Bearer s3cret", "Bearer wrong"), ("Bearer wrong", "Bearer s3cret"),
                     ("Bearer s3cret", "Bearer s3cret")):
            conn = httpclient.HTTPConnection(urllib.parse.urlsplit(u).netloc, timeout=60)
            conn.putrequest("GET", "/v1/models")
            for value in pair:
                conn.putheader("Authorization", value)
            conn.endheaders()
            reply = conn.getresponse()
            self.assertEqual((reply.status, json.loads(reply.read())["error"]["code"]), (401, "invalid_api_key"),
                             pair)
            conn.close()
        # /tokenize and /detokenize are guarded like /v1/ (they reveal the vocabulary
        # and cost CPU): no key, a wrong key and a longer key are refused with
        # invalid_api_key, the right key is served.
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1, 2]})):
            for auth in (None, "Bearer wrong", "Bearer s3cret2", "s3cret"):
                headers = {"Authorization": auth} if auth else {}
                status, reply = http("POST", u + path, body, headers=headers)
                self.assertEqual(status, 401, f"{path} with {auth!r}: {reply}")
                self.assertEqual(reply["error"]["code"], "invalid_api_key", f"{path}: {reply}")
            status, reply = http("POST", u + path, body, headers={"Authorization": "Bearer s3cret"})
            self.assertEqual(status, 200, f"{path}: {reply}")
        self.assertEqual(http("GET", u + "/health")[0], 200)
        self.assertEqual(http("GET", u + "/metrics")[0], 200)
        with self.assertRaises(openai.AuthenticationError):
            srv.client(api_key="nope").models.list()
        r = srv.client(api_key="s3cret").completions.create(model=srv.model, prompt="Hi", max_tokens=2)
        self.assertEqual(len(r.choices), 1)


def nan_model_copy(src, dst, tensor="model.norm.weight", rows=None):
    """Copies the HF model directory `src` to `dst` with `tensor` (F32) all NaN, or only its
    rows `rows` (of a 2-D tensor), patched in the safetensors bytes (8-byte header length,
    JSON header, data)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        t = header[tensor]
        assert t["dtype"] == "F32", t
        begin, end = t["data_offsets"]
        row_bytes = 4 * t["shape"][-1]
        for first, last in ([(begin, end)] if rows is None else
                            [(begin + r * row_bytes, begin + (r + 1) * row_bytes) for r in rows]):
            f.seek(8 + n + first)
            f.write(struct.pack("<f", float("nan")) * ((last - first) // 4))


@unittest.skipUnless(os.environ.get("PAGEDSERVE_TEST_MODEL"), "PAGEDSERVE_TEST_MODEL (the random Llama) not set")
class NonFiniteLogitsTest(unittest.TestCase):
    """A model whose logits are NaN: each request fails alone with a 500 / an SSE error
    event, and the server keeps serving (health, tokenize, the next requests)."""

    def test_requests_fail_alone_and_the_server_serves_on(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "nan_llama")
            nan_model_copy(os.environ["PAGEDSERVE_TEST_MODEL"], model)
            srv = ServerProcess(extra=["--max-model-len=256"], model=model)
            try:
                self.check(srv)
            finally:
                self.assertEqual(srv.stop(), 0, srv.logs())
            self.assertIn("could not be sampled", srv.logs())

    def check(self, srv):
        u = srv.url
        results = [None] * 4

        def one(i):
            body = {"model": srv.model, "prompt": f"request {i}", "max_tokens": 4}
            results[i] = http("POST", u + "/v1/completions", body)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for status, body in results:
            self.assertEqual(status, 500, body)
            self.assertEqual(body["error"]["type"], "server_error", body)
            self.assertIn("could not be sampled", body["error"]["message"])
            self.assertIn("is nan", body["error"]["message"])
        out = curl("-N", "-H", "Content-Type: application/json", "-d",
                   json.dumps({"model": srv.model, "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4, "stream": True}), u + "/v1/chat/completions")
        self.assertIn('"finish_reason":"error"', out)
        self.assertIn("could not be sampled", out)
        self.assertTrue(out.rstrip().endswith("data: [DONE]"), out)
        self.assertEqual(http("GET", u + "/health")[0], 200)
        self.assertEqual(http("POST", u + "/tokenize", {"prompt": "still here"})[0], 200)
        self.assertTrue(wait_blocks_free(u))
        self.assertEqual(srv.proc.poll(), None, srv.logs())


@unittest.skipUnless(os.environ.get("PAGEDSERVE_TEST_MOE_MODEL"), "PAGEDSERVE_TEST_MOE_MODEL not set")
class NonFiniteMoeTokenTest(unittest.TestCase):
    """A mixture of experts whose token 599 has a NaN embedding: a request with that token
    fails alone (500, the sampler's message) while another runs beside it, and the server
    serves on with its KV blocks freed. The NaN reaches the router of that request's tokens;
    a router that refused the step stopped the engine (every request failed, the server exited)."""

    BAD = 599  # the highest id of the 600-token vocabulary

    def test_request_with_the_token_fails_alone(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "nan_mixtral")
            nan_model_copy(os.environ["PAGEDSERVE_TEST_MOE_MODEL"], model,
                           tensor="model.embed_tokens.weight", rows=[self.BAD])
            srv = ServerProcess(extra=["--max-model-len=256"], model=model)
            try:
                self.check(srv)
            finally:
                self.assertEqual(srv.stop(), 0, srv.logs())
            self.assertIn("could not be sampled", srv.logs())

    def check(self, srv):
        u = srv.url
        # Greedy, never the poisoned token (its embedding would fail the request too).
        good = {"model": srv.model, "prompt": [10, 20, 30, 40], "max_tokens": 48, "temperature": 0,
                "ignore_eos": True, "logit_bias": {str(self.BAD): -100}}
        results = {}

        def run(name, body):
            results[name] = http("POST", u + "/v1/completions", body)

        clean = threading.Thread(target=run, args=("clean", good))
        clean.start()
        for body in ({"model": srv.model, "prompt": [10, self.BAD, 30, 40], "max_tokens": 4,
                      "temperature": 0},
                     {"model": srv.model, "prompt": [10, self.BAD, 30], "max_tokens": 4,
                      "temperature": 0.8, "logprobs": 2}):
            status, reply = http("POST", u + "/v1/completions", body)
            self.assertEqual(status, 500, reply)
            self.assertEqual(reply["error"]["type"], "server_error", reply)
            self.assertIn("could not be sampled", reply["error"]["message"])
            self.assertIn("is nan", reply["error"]["message"])
        clean.join(120)
        status, reply = results["clean"]
        self.assertEqual(status, 200, reply)
        self.assertEqual(reply["usage"]["completion_tokens"], 48, reply)
        self.assertEqual(http("POST", u + "/v1/completions", good)[1]["choices"][0]["text"],
                         reply["choices"][0]["text"])
        self.assertEqual(http("GET", u + "/health")[0], 200)
        self.assertTrue(wait_blocks_free(u))
        self.assertEqual(srv.proc.poll(), None, srv.logs())


def require_model(test, path):
    """Fails the test, naming the file, when the model is missing: these tests are
    registered whether or not it existed at configure time (tests/http/CMakeLists.txt)."""
    if not os.path.exists(path):
        sys.exit(f"{test}: FAILED: the model {path} does not exist (scripts/fetch-model prints "
                 "where it puts it; configure with -DPAGEDSERVE_MODEL=PATH)")


def main():
    global ARGS, SERVER
    parser = argparse.ArgumentParser()
    parser.add_argument("--pagedserve", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    require_model("http_test", ARGS.model)
    SERVER = ServerProcess()
    try:
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    finally:
        rc = SERVER.stop()
    if rc != 0:
        print(f"server exited with {rc}:\n{SERVER.logs()}", file=sys.stderr)
        sys.exit(1)
    if not prog.result.wasSuccessful():
        print(SERVER.logs()[-4000:], file=sys.stderr)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
