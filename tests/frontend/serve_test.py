#!/usr/bin/env python3
"""End-to-end tests of `pagedserve serve` over ZeroMQ (protocol v1).

    serve_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL_DIR [--mpirun]
                  [-k PATTERN]

Starts REAL server processes (free ports, bounded start-up), drives them with raw
pyzmq DEALER sockets, the Python client (clients/python) and `pagedserve
client`, and kills every process it started on the way out. With --mpirun the
main server runs as `mpirun -np 2 pagedserve serve` (coordinator + 1 worker).

The model is the random-weight Llama fixture (tests/fixtures/make_random_llama.py,
SmolLM2 tokenizer and chat template): the tests check the protocol and the
serving machinery, not the text's quality. Greedy decoding is deterministic, which
is what the exactness checks (streamed == non-streamed) rely on.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
import pagedserve_client  # noqa: E402

ARGS = None
MAX_MODEL_LEN = 256
# Waiting bounds, multiplied by PAGEDSERVE_TEST_TIME_SCALE (default 1) on a slow
# or shared machine: they are there so that a hang fails, not to time anything.
TIME_SCALE = max(1.0, float(os.environ.get("PAGEDSERVE_TEST_TIME_SCALE", "1") or 1))
START_TIMEOUT = 120.0 * TIME_SCALE
REPLY_TIMEOUT = 60.0 * TIME_SCALE


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A `pagedserve serve` process (optionally under mpirun) on free ports."""

    def __init__(self, extra=(), mpirun=False, metrics=True, tty=False, env_extra=None, model_argument=False):
        """tty: stdout and stderr on a pseudo-terminal (logs() reads it);
        model_argument: `serve MODEL` instead of `serve --model=MODEL`."""
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.metrics_port = free_port() if metrics else 0
        self.pid_file = tempfile.NamedTemporaryFile(prefix="pagedserve-test-", suffix=".pid", delete=False).name
        os.unlink(self.pid_file)
        model = ARGS.model if model_argument else f"--model={ARGS.model}"
        cmd = [ARGS.pagedserve, "serve", model, f"--zmq-endpoint={self.endpoint}",
               f"--max-model-len={MAX_MODEL_LEN}", "--kv-cache-memory=67108864", "--swap-space=0.0625",
               f"--metrics-port={self.metrics_port}", f"--pid-file={self.pid_file}", "--port=0"] + list(extra)
        # A colour terminal type, as on a developer's machine: a rank whose
        # colour decision were isatty + TERM alone would then colour its log
        # lines under mpirun (OpenMPI hands ranks a pseudo-terminal).
        env = dict(os.environ, TERM="xterm-256color")
        env.pop("NO_COLOR", None)
        env.update(env_extra or {})
        if mpirun:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
            cmd = ["mpirun", "-np", "2", "--oversubscribe"] + cmd
        self.log = tempfile.TemporaryFile()
        out = self.log
        if tty:
            master, out = os.openpty()
            self.tty_output = bytearray()
            self.tty_reader = threading.Thread(target=self.read_tty, args=(master,), daemon=True)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                     start_new_session=True)
        if tty:
            os.close(out)
            self.tty_reader.start()
        self.wait_healthy()

    def read_tty(self, master):
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                data = b""
            if not data:
                os.close(master)
                return
            self.tty_output += data

    def logs(self):
        if hasattr(self, "tty_output"):
            return bytes(self.tty_output).decode("utf-8", "replace")
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.logs()}")
            try:
                with pagedserve_client.Client(self.endpoint, timeout=1.0) as c:
                    if c.health():
                        return
            except pagedserve_client.PagedServeError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not healthy within {START_TIMEOUT} s:\n{self.logs()}")

    def coordinator_pid(self):
        with open(self.pid_file) as f:
            return int(f.read())

    def metric(self, name, labels=""):
        """Value of one Prometheus series (0 when absent)."""
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        pattern = re.compile(r"^" + re.escape(name) + (r"\{[^}]*" + re.escape(labels) + r"[^}]*\}" if labels else r"(\{[^}]*\})?")
                             + r"\s+(\S+)$", re.M)
        m = pattern.search(body)
        return float(m.group(m.lastindex)) if m else 0.0

    def stop(self, timeout=60):
        """SIGTERM to the coordinator; returns the exit code of the process we started."""
        if self.proc.poll() is None:
            try:
                os.kill(self.coordinator_pid(), signal.SIGTERM)
            except (OSError, ValueError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(10)


class Raw:
    """A raw DEALER socket speaking JSON."""

    def __init__(self, endpoint, ctx=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, obj):
        self.sock.send(json.dumps(obj).encode() if not isinstance(obj, bytes) else obj)

    def recv(self, timeout=REPLY_TIMEOUT):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply within {timeout} s")
        frames = self.sock.recv_multipart()
        assert len(frames) == 1, frames
        return json.loads(frames[0])

    def close(self):
        self.sock.close(0)


def gen(rid, **fields):
    msg = {"version": 1, "type": "generate", "id": rid}
    msg.update(fields)
    return msg


def collect(raw, rid, timeout=REPLY_TIMEOUT):
    """Replies of request rid until its final or error; (deltas, final_or_error)."""
    deltas = []
    while True:
        m = raw.recv(timeout)
        assert m["version"] == 1, m
        if m.get("id") != rid:
            raise AssertionError(f"reply for another request: {m}")
        if m["type"] == "delta":
            deltas.append(m)
        elif m["type"] in ("final", "error"):
            return deltas, m


def joined(deltas, index=0):
    text, ids = "", []
    for d in deltas:
        for o in d["outputs"]:
            if o["index"] == index:
                text += o["text"]
                ids += o["token_ids"]
    return text, ids


def wait_drained(timeout=10 * TIME_SCALE, server=None):
    """(running, waiting, kv_blocks_used) once they are all 0, or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        with pagedserve_client.Client((server or SERVER).endpoint, timeout=REPLY_TIMEOUT) as c:
            s = c.stats()
        got = (s["num_running"], s["num_waiting"], s["kv_blocks_used"])
        if got == (0, 0, 0) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


SERVER = None


def setUpModule():
    global SERVER
    SERVER = ServerProcess(["--zmq-heartbeat-interval-ms=200", "--zmq-heartbeat-timeout-ms=1500"],
                           mpirun=ARGS.mpirun)


def tearDownModule():
    if SERVER is not None:
        rc = SERVER.stop()
        if rc != 0:
            print(SERVER.logs(), file=sys.stderr)
        assert rc == 0, f"server exit code {rc}"


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.raw = Raw(SERVER.endpoint)

    def tearDown(self):
        self.raw.close()

    def generate(self, rid, **fields):
        self.raw.send(gen(rid, **fields))
        return collect(self.raw, rid)

    def test_plain_streamed_equals_non_streamed(self):
        _, final = self.generate("a", prompt="The capital of France is", max_tokens=12, temperature=0)
        self.assertEqual(final["type"], "final", final)
        out = final["outputs"][0]
        self.assertEqual(len(out["token_ids"]), 12)
        self.assertEqual(out["finish_reason"], "length")
        self.assertGreater(final["usage"]["prompt_tokens"], 0)
        self.assertEqual(final["usage"]["completion_tokens"], 12)
        deltas, sfinal = self.generate("b", prompt="The capital of France is", max_tokens=12, temperature=0,
                                       stream=True)
        self.assertEqual(sfinal["type"], "final")
        self.assertTrue(sfinal["stream"])
        self.assertNotIn("text", sfinal["outputs"][0])
        text, ids = joined(deltas)
        self.assertEqual(ids, out["token_ids"])
        self.assertEqual(text, out["text"])
        self.assertEqual(deltas[-1]["outputs"][-1].get("finish_reason"), "length")

    def test_chat_and_token_ids(self):
        _, final = self.generate("c", messages=[{"role": "user", "content": "Hi there"}], max_tokens=4,
                                 temperature=0)
        self.assertEqual(final["type"], "final", final)
        # ChatML with the default system turn: far more tokens than the two words.
        self.assertGreater(final["usage"]["prompt_tokens"], 15)
        _, f1 = self.generate("t1", prompt_token_ids=[504, 3458, 314, 1345], max_tokens=5, temperature=0)
        _, f2 = self.generate("t2", prompt_token_ids=[504, 3458, 314, 1345], max_tokens=5, temperature=0)
        self.assertEqual(f1["type"], "final", f1)
        self.assertEqual(f1["usage"]["prompt_tokens"], 4)
        self.assertEqual(f1["outputs"][0]["token_ids"], f2["outputs"][0]["token_ids"])

    def test_n2_streamed(self):
        deltas, final = self.generate("n2", prompt="Once upon a time", n=2, max_tokens=6, temperature=0.8,
                                      seed=7, stream=True)
        self.assertEqual(final["type"], "final", final)
        self.assertEqual([o["index"] for o in final["outputs"]], [0, 1])
        for i in (0, 1):
            _, ids = joined(deltas, i)
            self.assertEqual(len(ids), 6)
        self.assertEqual(final["usage"]["completion_tokens"], 12)

    def test_beam_search(self):
        # n = 2 of best_of 3 beams: outputs best first with cumulative_logprob
        # in the final message; streamed, the deltas come when the search ends.
        fields = dict(prompt="Once upon a time", n=2, best_of=3, use_beam_search=True, max_tokens=6,
                      ignore_eos=True, length_penalty=1.0, early_stopping=False)
        _, final = self.generate("beam", **fields)
        self.assertEqual(final["type"], "final", final)
        outs = final["outputs"]
        self.assertEqual([o["index"] for o in outs], [0, 1])
        self.assertTrue(all(len(o["token_ids"]) == 6 for o in outs), outs)
        self.assertGreaterEqual(outs[0]["cumulative_logprob"], outs[1]["cumulative_logprob"])
        self.assertNotEqual(outs[0]["token_ids"], outs[1]["token_ids"])
        deltas, sfinal = self.generate("beam-s", stream=True, **fields)
        self.assertEqual([o["cumulative_logprob"] for o in sfinal["outputs"]],
                         [o["cumulative_logprob"] for o in outs])
        for i in (0, 1):
            self.assertEqual(joined(deltas, i), (outs[i]["text"], outs[i]["token_ids"]))
        _, err = self.generate("beam-bad", prompt="x", use_beam_search=True, n=2, temperature=0.5)
        self.assertEqual((err["type"], err["code"]), ("error", "invalid_request"), err)
        self.assertIn("temperature must be 0", err["message"])

    def test_stop_string_spanning_tokens(self):
        _, ref = self.generate("s0", prompt="Tell me a story", max_tokens=24, temperature=0, ignore_eos=True)
        text = ref["outputs"][0]["text"]
        # A stop string made of the end of one token and the start of the next:
        # token boundaries from a streamed run (deltas split between tokens).
        pieces = []
        deltas, _ = self.generate("s1", prompt="Tell me a story", max_tokens=24, temperature=0, ignore_eos=True,
                                  stream=True)
        for d in deltas:
            for o in d["outputs"]:
                pieces.append(o["text"])
        self.assertEqual("".join(pieces), text)
        offset, stop, cut = 0, None, None
        for a, b in zip(pieces, pieces[1:]):
            offset += len(a)
            if len(a) >= 2 and len(b) >= 2 and offset > 4:
                stop = a[-2:] + b[:2]
                cut = text.find(stop)
                break
        self.assertIsNotNone(stop, f"no two-token boundary in {pieces}")
        for stream in (False, True):
            deltas, f = self.generate(f"s2{stream}", prompt="Tell me a story", max_tokens=24, temperature=0,
                                      ignore_eos=True, stop=[stop], stream=stream)
            self.assertEqual(f["type"], "final", f)
            self.assertEqual(f["outputs"][0]["finish_reason"], "stop")
            got = joined(deltas)[0] if stream else f["outputs"][0]["text"]
            self.assertEqual(got, text[:cut], f"stop {stop!r}")
        # A sequence ended by a stop string frees its blocks without another request.
        self.assertEqual(wait_drained(), (0, 0, 0))

    def test_prompt_logprobs(self):
        ids = [504, 3458, 314, 1345]
        _, f = self.generate("pl", prompt_token_ids=ids, max_tokens=1, temperature=0, prompt_logprobs=2)
        self.assertEqual(f["type"], "final", f)
        lps = f["prompt_logprobs"]
        self.assertEqual([e["token_id"] for e in lps], ids[1:])
        for e in lps:
            self.assertLessEqual(e["logprob"], 0)
            self.assertGreaterEqual(e["rank"], 1)
            self.assertEqual(len(e["top"]), 2)
            if e["rank"] == 1:
                self.assertEqual(e["top"][0]["token_id"], e["token_id"])

    def test_logit_processors_and_output_options(self):
        """Issue 32's fields over protocol v1: the same effects as on the HTTP API."""
        base = dict(prompt="1, 2, 3, 4,", max_tokens=6, temperature=0, ignore_eos=True)
        _, ref = self.generate("lp0", **base)
        out = ref["outputs"][0]
        first = out["token_ids"][0]
        _, f = self.generate("lp1", logit_bias={str(first): -100}, **base)
        self.assertEqual(f["type"], "final", f)
        self.assertNotEqual(f["outputs"][0]["token_ids"][0], first)
        _, f = self.generate("lp2", logit_bias={"7": 100}, **base)
        self.assertEqual(f["outputs"][0]["token_ids"], [7] * 6)
        stop = out["text"][2:5]
        cut = out["text"].index(stop)
        _, f = self.generate("lp3", stop=[stop], include_stop_str_in_output=True, **base)
        self.assertEqual(f["outputs"][0]["text"], out["text"][:cut + len(stop)])
        _, f = self.generate("lp4", stop=[stop], min_tokens=6, **base)
        self.assertEqual(f["outputs"][0]["text"], out["text"])
        word = out["text"].split()[0]
        _, f = self.generate("lp5", bad_words=[word], **base)
        self.assertNotEqual(f["outputs"][0]["text"], out["text"])
        for rid, fields in (("lp6", {"logit_bias": {"1": 101}}), ("lp7", {"min_tokens": 7}),
                            ("lp8", {"bad_words": [""]}), ("lp9", {"prompt_logprobs": 1, "stream": True})):
            _, err = self.generate(rid, **base, **fields)
            self.assertEqual((err["type"], err["code"]), ("error", "invalid_request"), err)

    def test_abort(self):
        self.raw.send(gen("ab", prompt="Count to a thousand", max_tokens=200, ignore_eos=True, stream=True))
        first = self.raw.recv()
        self.assertEqual(first["type"], "delta", first)
        self.raw.send({"version": 1, "type": "abort", "id": "ab"})
        saw_ack = False
        while True:
            m = self.raw.recv()
            if m["type"] == "abort_ack":
                saw_ack = True
            if m["type"] == "final":
                break
        self.assertTrue(saw_ack)
        self.assertEqual(m["outputs"][0]["finish_reason"], "abort")
        self.assertLess(m["usage"]["completion_tokens"], 200)
        self.raw.send({"version": 1, "type": "abort", "id": "ab"})
        self.assertEqual(self.raw.recv()["code"], "not_found")

    def test_duplicate_id_and_same_ids_on_two_clients(self):
        other = Raw(SERVER.endpoint)
        try:
            self.raw.send(gen("same", prompt="Hello", max_tokens=30, ignore_eos=True))
            self.raw.send(gen("same", prompt="Hello", max_tokens=3))
            other.send(gen("same", prompt="Hello", max_tokens=3))
            m = self.raw.recv()
            self.assertEqual((m["type"], m.get("code")), ("error", "duplicate_id"), m)
            self.assertEqual(collect(other, "same")[1]["type"], "final")
            self.assertEqual(collect(self.raw, "same")[1]["type"], "final")
        finally:
            other.close()

    def test_health_and_stats(self):
        self.raw.send({"version": 1, "type": "health", "id": "h"})
        self.assertEqual(self.raw.recv(), {"version": 1, "type": "health", "id": "h", "status": "ok"})
        self.raw.send({"version": 1, "type": "stats"})
        s = self.raw.recv()
        self.assertEqual(s["type"], "stats")
        self.assertEqual(s["max_model_len"], MAX_MODEL_LEN)
        self.assertGreater(s["kv_blocks_total"], 0)
        self.assertEqual(s["max_waiting"], 256)


BAD = [
    (b"not json", "invalid_json"),
    (b"[1, 2]", "invalid_request"),
    (gen("w", prompt=5), "invalid_request"),
    ({"version": 1, "type": "teleport", "id": "u"}, "unknown_type"),
    ({"version": 2, "type": "health"}, "unsupported_version"),
    (gen("m"), "invalid_request"),
    (gen("e", prompt=""), "invalid_request"),
    (gen("z", prompt="x", max_tokens=0), "invalid_request"),
    (gen("z", prompt="x", max_tokens=-1), "invalid_request"),
    (gen("k", prompt="x", top_k=0.5), "invalid_request"),
    (gen("p", prompt="x", top_p=0), "invalid_request"),
    (gen("p", prompt="x", top_p=1.5), "invalid_request"),
    (gen("t", prompt="x", temperature=-1), "invalid_request"),
    (gen("v", prompt_token_ids=[1, 10 ** 6]), "invalid_request"),
    (gen("l", prompt_token_ids=[100] * MAX_MODEL_LEN), "prompt_too_long"),
    (gen("l2", prompt="word " * (2 * MAX_MODEL_LEN)), "prompt_too_long"),
    (gen("x", prompt="x", max_token=3), "invalid_request"),
]


class BadInputTest(unittest.TestCase):
    def setUp(self):
        self.raw = Raw(SERVER.endpoint)

    def tearDown(self):
        self.raw.close()

    def assert_still_serving(self, raw=None):
        raw = raw or self.raw
        raw.send(gen("ok", prompt="Still there?", max_tokens=2, temperature=0))
        _, final = collect(raw, "ok")
        self.assertEqual(final["type"], "final", final)

    def test_each_bad_input_then_a_valid_request(self):
        for message, code in BAD:
            with self.subTest(message=str(message)[:80]):
                self.raw.send(message)
                m = self.raw.recv()
                self.assertEqual(m["type"], "error", m)
                self.assertEqual(m["code"], code, m)
                self.assertTrue(m["message"])
                if isinstance(message, dict) and "id" in message and code != "invalid_json":
                    self.assertEqual(m.get("id"), message["id"])
                self.assert_still_serving()

    def test_ten_megabyte_message(self):
        big = json.dumps(gen("big", prompt="a" * (10 * 1000 * 1000))).encode()
        self.raw.send(big)
        m = self.raw.recv()
        self.assertEqual((m["type"], m["code"]), ("error", "message_too_large"), m)
        self.assert_still_serving()
        # Beyond the transport bound (16 MiB) libzmq drops the connection unread.
        huge = Raw(SERVER.endpoint)
        try:
            huge.send(b"x" * (20 << 20))
            self.assertFalse(huge.sock.poll(1000))
        finally:
            huge.close()
        self.assert_still_serving()

    def test_multipart_and_half_multipart(self):
        self.raw.sock.send_multipart([b"", json.dumps(gen("mp", prompt="x")).encode()])
        m = self.raw.recv()
        self.assertEqual((m["type"], m["code"]), ("error", "invalid_request"), m)
        half = Raw(SERVER.endpoint)
        try:
            half.sock.send(json.dumps(gen("h1", prompt="x")).encode(), zmq.SNDMORE)
            # The server never sees the incomplete message and serves others.
            self.assert_still_serving()
            self.assertFalse(half.sock.poll(300))
            half.sock.send(b"second part")
            m = half.recv()
            self.assertEqual((m["type"], m["code"]), ("error", "invalid_request"), m)
            self.assert_still_serving(half)
        finally:
            half.close()


class ClientsTest(unittest.TestCase):
    def test_python_client(self):
        with pagedserve_client.Client(SERVER.endpoint, timeout=REPLY_TIMEOUT) as c:
            self.assertTrue(c.health())
            stream = c.stream("Write a haiku", max_tokens=8, temperature=0)
            text = "".join(d.text for d in stream)
            self.assertEqual(stream.final.outputs[0].finish_reason, "length")
            result = c.generate("Write a haiku", max_tokens=8, temperature=0)
            self.assertEqual(result.outputs[0].text, text)
            chat = c.generate(messages=[{"role": "user", "content": "Hi!"}], n=2, max_tokens=3)
            self.assertEqual(len(chat.outputs), 2)
            with self.assertRaises(pagedserve_client.PagedServeError) as e:
                c.generate("x", top_p=1.5)
            self.assertEqual(e.exception.code, "invalid_request")
            self.assertEqual(c.stats()["max_model_len"], MAX_MODEL_LEN)

    def test_cli_client(self):
        base = [ARGS.pagedserve, "client", f"--zmq-endpoint={SERVER.endpoint}"]
        r = subprocess.run(base + ["--health"], capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run(base + ["--stats"], capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["type"], "stats")
        r = subprocess.run(base + ["--max-tokens=6", "--temperature=0", "Write a haiku"], capture_output=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        with pagedserve_client.Client(SERVER.endpoint, timeout=REPLY_TIMEOUT) as c:
            expected = c.generate("Write a haiku", max_tokens=6, temperature=0).outputs[0].text
        self.assertEqual(r.stdout.decode(), expected)
        r = subprocess.run(base + ["--chat", "--max-tokens=3"], input=b"Hello from stdin", capture_output=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"finish_reason=", r.stderr)
        r = subprocess.run(base + ["--top-p=1.5", "x"], capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        # A given --max-tokens beyond the context's room is refused naming it (vLLM's 400);
        # the default is lowered to the room instead (a prompt that leaves room for fewer than 16).
        r = subprocess.run(base + [f"--max-tokens={MAX_MODEL_LEN}", "x"], capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(b"invalid_request: max_tokens (256) is too large", r.stderr)
        near_full = "x" + " x" * (MAX_MODEL_LEN - 12)
        with pagedserve_client.Client(SERVER.endpoint, timeout=REPLY_TIMEOUT) as c:
            room = MAX_MODEL_LEN - c.generate(near_full, max_tokens=1).usage["prompt_tokens"]
        self.assertTrue(0 < room < 16, room)
        r = subprocess.run(base + ["--temperature=0", "--ignore-eos", near_full], capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"finish_reason=length", r.stderr)
        self.assertIn(f"completion_tokens={room} ".encode(), r.stderr)
        dead = [ARGS.pagedserve, "client", f"--zmq-endpoint=tcp://127.0.0.1:{free_port()}", "--health",
                "--client-timeout=0.5"]
        r = subprocess.run(dead, capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 1)


class LoadTest(unittest.TestCase):
    """Greedy tokens must not depend on what shares a batch. That holds on the
    exact fp32 path (--dtype float32: one SGEMM per projection whatever the token
    count) and for GGUF-quantized weights (row dots for any batch). fp32/fp16/bf16
    matrices kept in their stored format (--dtype auto, the random Llama's F32
    safetensors) switch from row dots to a tiled SGEMM at 24 / 128 tokens, which
    can flip a near-tie (1 of 200 here on an AVX2 machine; docs/serving.md), so
    this test runs its own server on the fp32 path."""
    CLIENTS, PER_CLIENT, MAX_TOKENS = 20, 10, 8

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(["--dtype=float32"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        assert rc == 0, f"server exit code {rc}:\n{cls.server.logs()}"

    def run_all(self, stream):
        results = {}
        errors = []
        barrier = threading.Barrier(self.CLIENTS)

        def client(c):
            raw = Raw(self.server.endpoint, zmq.Context.instance())
            try:
                barrier.wait(30)
                for r in range(self.PER_CLIENT):
                    raw.send(gen(f"r{r}", prompt=f"Request {r} from client {c}: tell me about number {c * r}",
                                 max_tokens=self.MAX_TOKENS, temperature=0, ignore_eos=True, stream=stream))
                pending = {f"r{r}": [] for r in range(self.PER_CLIENT)}
                while pending:
                    m = raw.recv(120)
                    rid = m["id"]
                    if m["type"] == "delta":
                        pending[rid].append(m)
                    elif m["type"] == "final":
                        results[(c, rid)] = (joined(pending.pop(rid)), m)
                    else:
                        errors.append(m)
                        pending.pop(rid, None)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
            finally:
                raw.close()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(self.CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), self.CLIENTS * self.PER_CLIENT)
        return results

    def test_200_streams_from_20_clients(self):
        start = time.monotonic()
        streamed = self.run_all(True)
        took = time.monotonic() - start
        for key, ((text, ids), final) in streamed.items():
            self.assertEqual(len(ids), self.MAX_TOKENS, key)
            self.assertEqual(final["usage"]["completion_tokens"], self.MAX_TOKENS)
        plain = self.run_all(False)
        # Greedy decoding: every request gives the same tokens and text streamed
        # and non-streamed, whatever else shares its batches. No mismatch is
        # tolerated: batch-dependent numerics that flip a token are a bug.
        mismatched = [key for key, ((text, ids), _) in streamed.items()
                      if (plain[key][1]["outputs"][0]["token_ids"], plain[key][1]["outputs"][0]["text"])
                      != (ids, text)]
        self.assertEqual(mismatched, [], f"{len(mismatched)} of {len(streamed)} differ")
        self.assertEqual(wait_drained(server=self.server), (0, 0, 0))
        print(f"load: 200 streamed requests x {self.MAX_TOKENS} tokens in {took:.1f} s", file=sys.stderr)


CLIENT_SCRIPT = r"""
import json, sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.DEALER); s.connect(sys.argv[1])
s.send(json.dumps({"version": 1, "type": "generate", "id": "v", "prompt": "Go on forever",
                   "max_tokens": int(sys.argv[2]), "ignore_eos": True, "stream": True}).encode())
s.recv(); print("streaming", flush=True)
import time; time.sleep(600)
"""


class DisconnectTest(unittest.TestCase):
    # A server of its own with a long context: the vanishing client's request
    # (2000 tokens, some 20 s of decoding on an idle machine) must still be
    # running when the disconnect is noticed (heartbeat timeout 1.5 s). With
    # the shared server's 256-token context the request could end by length
    # first on a loaded machine, and no abort was counted.
    MAX_TOKENS = 2000

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(["--zmq-heartbeat-interval-ms=200", "--zmq-heartbeat-timeout-ms=1500",
                                    "--max-model-len=2048"], mpirun=ARGS.mpirun)

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        if rc != 0:
            print(cls.server.logs(), file=sys.stderr)
        assert rc == 0, f"server exit code {rc}"

    def run_vanishing_client(self, how):
        server = self.server
        aborts = server.metric("pagedserve_requests_finished_total", 'finish_reason="abort"')
        lengths = server.metric("pagedserve_requests_finished_total", 'finish_reason="length"')
        p = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, server.endpoint, str(self.MAX_TOKENS)],
                             stdout=subprocess.PIPE)
        try:
            self.assertEqual(p.stdout.readline().strip(), b"streaming")
            if how == "kill":
                p.kill()
            else:
                p.send_signal(signal.SIGSTOP)  # silent: no heartbeat answers
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if server.metric("pagedserve_requests_finished_total", 'finish_reason="abort"') > aborts:
                    break
                time.sleep(0.05)
            self.assertEqual(server.metric("pagedserve_requests_finished_total", 'finish_reason="length"'),
                             lengths, "the request ran to its end before the disconnect was noticed")
            self.assertGreater(server.metric("pagedserve_requests_finished_total", 'finish_reason="abort"'), aborts)
            self.assertEqual(wait_drained(server=server), (0, 0, 0))
        finally:
            p.kill()
            p.wait(10)

    def test_killed_client(self):
        self.run_vanishing_client("kill")

    def test_silent_client(self):
        self.run_vanishing_client("stop")


class LogOutputTest(unittest.TestCase):
    """What the server writes to a file or a pipe (under mpirun: through the
    rank's pseudo-terminal): the startup line names the KV cache dtype, and no
    log line carries ANSI colour codes unless --log-color=always asks for them."""

    def request_logged(self, server):
        raw = Raw(server.endpoint)
        raw.send(gen("log-1", prompt="one", max_tokens=2))
        _, final = collect(raw, "log-1")
        raw.close()
        self.assertEqual(final["type"], "final", final)
        deadline = time.monotonic() + REPLY_TIMEOUT
        while 'log-1" prompt_tokens=' not in server.logs() and time.monotonic() < deadline:
            time.sleep(0.05)
        logs = server.logs()
        self.assertIn('log-1" prompt_tokens=', logs)  # the request log line (spdlog) is there
        return logs

    def test_startup_line_and_no_colour_codes(self):
        logs = self.request_logged(SERVER)
        self.assertNotIn("\x1b[", logs)
        self.assertRegex(logs, r"KV blocks \d+ x \d+ tokens, KV cache dtype (f16|f32)")

    def test_terminal_colours_unless_no_color_or_mpirun(self):
        # --log-color=auto with the output on a terminal: colours, except with
        # NO_COLOR=1 and under mpirun (the terminal is then mpirun's).
        for env, coloured in (({}, not ARGS.mpirun), ({"NO_COLOR": "1"}, False)):
            server = ServerProcess(metrics=False, tty=True, env_extra=env, mpirun=ARGS.mpirun)
            try:
                self.assertEqual("\x1b[" in self.request_logged(server), coloured, env)
            finally:
                server.stop()

    def test_log_color_always(self):
        server = ServerProcess(["--log-color=always"], mpirun=ARGS.mpirun, metrics=False)
        try:
            self.assertIn("\x1b[", self.request_logged(server))
        finally:
            server.stop()


STATS_LINE = re.compile(
    r"\[(info|debug)\] Avg prompt throughput: ([0-9.]+) tokens/s, Avg generation throughput: ([0-9.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, Swapped: (\d+) reqs, Device KV cache usage: ([0-9.]+)%, "
    r"CPU swap usage: ([0-9.]+)%, Prefix cache hit rate: ([0-9.]+)%")


def stats_lines(logs):
    """[(level, prompt_tps, generation_tps, running, waiting, swapped, kv%, swap%, hit%)]."""
    return [(m.group(1),) + tuple(float(g) for g in m.groups()[1:]) for m in STATS_LINE.finditer(logs)]


def wait_for_logs(server, predicate, what, timeout=REPLY_TIMEOUT):
    """The server's logs once predicate(logs) holds; fails at the deadline."""
    deadline = time.monotonic() + timeout
    logs = server.logs()
    while not predicate(logs):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in the logs within {timeout} s:\n{logs[-3000:]}")
        time.sleep(0.05)
        logs = server.logs()
    return logs


class OperateTest(unittest.TestCase):
    """What a vLLM user expects of the server's defaults, flags and logs:
    `serve MODEL`, --seed, --log-level, the periodic stats line,
    --disable-log-stats and --log-format json."""

    # Long enough to fill whole KV blocks, so that the prefix cache (on by
    # default) hits on the second request.
    PROMPT = "The quick brown fox jumps over the lazy dog. " * 6

    def sampled_texts(self, server, count=2):
        """Token ids of `count` identical unseeded temperature-1 requests, one after the other."""
        raw = Raw(server.endpoint)
        try:
            texts = []
            for i in range(count):
                raw.send(gen(f"seed-{i}", prompt="Once upon a time", max_tokens=16, temperature=1.0,
                             ignore_eos=True))
                _, final = collect(raw, f"seed-{i}")
                self.assertEqual(final["type"], "final", final)
                self.assertEqual(len(final["outputs"][0]["token_ids"]), 16, final)
                texts.append(final["outputs"][0]["token_ids"])
            return texts
        finally:
            raw.close()

    def test_seed_makes_unseeded_sampling_reproducible_across_runs(self):
        runs = []
        for seed, model_argument in ((1234, True), (1234, False), (4321, False)):
            server = ServerProcess([f"--seed={seed}"], metrics=False, model_argument=model_argument)
            try:
                runs.append(self.sampled_texts(server))
            finally:
                self.assertEqual(server.stop(), 0, server.logs())
        self.assertEqual(runs[0], runs[1], "the same --seed and requests: the same tokens on every run")
        self.assertNotEqual(runs[0][0], runs[0][1], "two requests of one run get different streams")
        self.assertNotEqual(runs[0], runs[2], "another --seed, other tokens")

    def test_stats_line_while_serving(self):
        server = ServerProcess(["--log-stats-interval=0.2", "--log-level=debug"], metrics=False,
                               model_argument=True)
        try:
            # Idle: the line is written at debug level only.
            wait_for_logs(server, lambda logs: any(line[0] == "debug" for line in stats_lines(logs)),
                          "an idle stats line at debug level")
            raw = Raw(server.endpoint)
            try:
                for rid in ("stats-1", "stats-2"):  # the second hits the first's cached prefix
                    raw.send(gen(rid, prompt=self.PROMPT, max_tokens=48, temperature=0, ignore_eos=True))
                    _, final = collect(raw, rid)
                    self.assertEqual(final["type"], "final", final)
            finally:
                raw.close()
            self.assertGreater(final["usage"]["cached_prompt_tokens"], 0)
            busy_seen = len(stats_lines(server.logs()))
            # After the work: one info line with the drop to zero, then debug lines.
            logs = wait_for_logs(server, lambda logs: [line[0] for line in stats_lines(logs)[busy_seen:]].count("debug") >= 1,
                                 "an idle stats line after the requests")
        finally:
            self.assertEqual(server.stop(), 0, server.logs())
        lines = stats_lines(logs)
        busy = [line for line in lines if line[1] > 0 or line[2] > 0 or line[3] + line[4] + line[5] > 0]
        self.assertTrue(busy, logs[-3000:])
        self.assertTrue(all(line[0] == "info" for line in busy), busy)
        self.assertTrue(any(line[1] > 0 for line in busy), "prompt throughput while prefilling")
        self.assertTrue(any(line[2] > 0 for line in busy), "generation throughput while decoding")
        for level, prompt_tps, gen_tps, running, waiting, swapped, kv, swap, hit in lines:
            self.assertLessEqual(running + waiting + swapped, 2)
            self.assertTrue(0 <= kv <= 100 and 0 <= swap <= 100 and 0 <= hit <= 100)
            self.assertLess(gen_tps, 1e6)
        # Tokens over the busy intervals add up to what was computed, within
        # the rounding of the figures (0.1 tokens/s over intervals of ~0.2 s).
        last_busy = lines.index(busy[-1])
        idle_after = lines[last_busy + 1]
        self.assertEqual((idle_after[0], idle_after[1], idle_after[2], idle_after[3]), ("info", 0.0, 0.0, 0.0),
                         "the first idle line after work is at info level, with zeros")
        self.assertTrue(all(line[0] == "debug" for line in lines[last_busy + 2:]), lines[last_busy:])
        # Hit rate over all lookups: the second request's cached tokens of the two prompts.
        prompt_tokens = final["usage"]["prompt_tokens"]
        expected_hit = 100.0 * final["usage"]["cached_prompt_tokens"] / (2 * prompt_tokens)
        self.assertAlmostEqual(lines[-1][8], expected_hit, delta=0.06)

    def test_log_format_json(self):
        server = ServerProcess(["--log-format=json", "--log-stats-interval=0.1", "--log-color=always",
                                "--log-request-content"], metrics=False)
        try:
            raw = Raw(server.endpoint)
            raw.send(gen("json-log", prompt='A "quoted"\tprompt\\', max_tokens=8, temperature=0))
            _, final = collect(raw, "json-log")
            raw.close()
            self.assertEqual(final["type"], "final", final)
            # A fast machine finishes the request inside one interval: the
            # stats line for it comes at the next tick, so wait for it before
            # stopping (the stop would otherwise race the tick).
            wait_for_logs(server, lambda logs: any(STATS_LINE.search("[info] " + json.loads(line)["message"])
                                                   for line in logs.split("\n")[:-1] if line.startswith("{")),
                          "an info stats line in JSON")
        finally:
            self.assertEqual(server.stop(), 0, server.logs())
        objects = []
        for line in server.logs().splitlines():
            if line.startswith("pagedserve serve: "):
                continue  # the ready and stop lines on stderr are not log lines
            obj = json.loads(line)  # every other line is one JSON object
            self.assertEqual(sorted(obj), ["level", "message", "time"], line)
            self.assertRegex(obj["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            objects.append(obj)
        messages = [o["message"] for o in objects]
        self.assertTrue(any('json-log" prompt_tokens=' in m for m in messages), messages)  # quotes escaped
        # The request log C-escapes the prompt; the JSON layer escapes that
        # again and json.loads gives the request log's text back exactly.
        self.assertTrue(any('prompt="A \\"quoted\\"\\tprompt\\\\"' in m for m in messages), messages)
        self.assertTrue(any(STATS_LINE.search("[info] " + m) for m in messages), messages)
        self.assertEqual({o["level"] for o in objects}, {"info"})
        self.assertNotIn("\x1b[", server.logs(), "no colour codes in JSON, even with --log-color=always")

    def test_disable_log_stats_and_log_level(self):
        for flags, request_logged in ((["--disable-log-stats"], True), (["--log-level=warning"], False)):
            server = ServerProcess(["--log-stats-interval=0.05"] + flags, metrics=False)
            try:
                raw = Raw(server.endpoint)
                started = time.monotonic()
                raw.send(gen("quiet", prompt=self.PROMPT, max_tokens=128, temperature=0, ignore_eos=True))
                _, final = collect(raw, "quiet")
                elapsed = time.monotonic() - started
                raw.close()
                self.assertEqual(final["type"], "final", final)
            finally:
                self.assertEqual(server.stop(), 0, server.logs())
            logs = server.logs()
            # The request ran over several intervals: without the flags there would be lines.
            self.assertGreater(elapsed, 0.1, flags)
            self.assertEqual(stats_lines(logs), [], flags)
            self.assertEqual('quiet" prompt_tokens=' in logs, request_logged, flags)
            self.assertIn("pagedserve serve: serving", logs)  # the banner is not a levelled log line


class ServeFlagsTest(unittest.TestCase):
    def serve(self, *flags):
        return subprocess.run([ARGS.pagedserve, "serve", f"--model={ARGS.model}", "--kv-cache-memory=67108864",
                               "--swap-space=0.0625", f"--max-model-len={MAX_MODEL_LEN}", "--port=0"] + list(flags),
                              capture_output=True, timeout=120)

    def test_endpoint_in_use_and_bad_flags(self):
        r = self.serve(f"--zmq-endpoint={SERVER.endpoint}")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(b"cannot bind --zmq-endpoint", r.stderr)
        r = self.serve("--max-queue-len=0")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(b"--max-queue-len", r.stderr)
        r = self.serve("--zmq-endpoint=nonsense://x")
        self.assertEqual(r.returncode, 1, r.stderr)


class BusyAndShutdownTest(unittest.TestCase):
    """A second server: one running sequence, a waiting queue of one, short grace."""

    def test_busy_then_graceful_shutdown(self):
        # r1 must still be running when the 1 s grace ends: 1500 tokens take
        # several seconds even on an idle machine (230 could finish in time).
        server = ServerProcess(["--max-num-seqs=1", "--max-queue-len=1", "--shutdown-grace=1",
                                "--max-model-len=2048"], metrics=False)
        raw = Raw(server.endpoint)
        try:
            raw.send(gen("r1", prompt="one", max_tokens=1500, ignore_eos=True, stream=True))
            self.assertEqual(raw.recv()["type"], "delta")  # r1 is running
            raw.send(gen("r2", prompt="two", max_tokens=1500, ignore_eos=True))  # waits
            raw.send(gen("r3", prompt="three", max_tokens=2))
            m = raw.recv()
            while m["type"] == "delta":
                m = raw.recv()
            self.assertEqual((m["type"], m.get("code"), m.get("id")), ("error", "busy", "r3"), m)
            os.kill(server.coordinator_pid(), signal.SIGTERM)
            finals = {}
            while len(finals) < 2:
                m = raw.recv()
                if m["type"] == "final":
                    finals[m["id"]] = m["outputs"][0]["finish_reason"]
            self.assertEqual(finals, {"r1": "abort", "r2": "abort"})
            self.assertEqual(server.proc.wait(30), 0, server.logs())
        finally:
            raw.close()
            server.kill()


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--pagedserve", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--mpirun", action="store_true")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
