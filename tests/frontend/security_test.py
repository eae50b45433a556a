#!/usr/bin/env python3
"""End-to-end security tests of `pagedserve serve` (docs/security.md).

    security_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL_DIR [-k PATTERN]

Against REAL server processes (serve_test.ServerProcess: free ports, bounded
start-up, every process killed on the way out):

- CurveZMQ: keys from `pagedserve keygen` and from pyzmq (zmq.auth), a server
  with --zmq-curve-secret-key-file and --zmq-curve-authorized-clients. Listed
  clients are served (Python client, `pagedserve client`); a client without
  CURVE, with a wrong server key or with an unlisted key gets no reply and
  costs the server nothing (no request admitted, no KV block, no token, no log
  line); a flood of failed handshakes from 200 connections does not slow a
  served client beyond a stated bound.
- cache_salt: the same prompt under two salts shares no cached block (metrics
  and usage.cached_prompt_tokens), under one salt it does; greedy output is the
  same either way; a malformed salt is refused and the server keeps serving;
  --require-cache-salt refuses unsalted requests.
- Request log: ids, token counts and timings only; prompt and completion text
  only with --log-request-content.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import zmq
import zmq.auth

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_test  # noqa: E402
from serve_test import ServerProcess, pagedserve_client  # noqa: E402

ARGS = None
KEYS = None  # temporary folder with the key files
PROMPT = ("The quick brown fox jumps over the lazy dog near the old river bank while "
          "seven zebras quietly paint purple quartz lanterns under a sleepy moon")


def keygen(name):
    """`pagedserve keygen KEYS/name`; returns the public key (stdout)."""
    r = subprocess.run([ARGS.pagedserve, "keygen", os.path.join(KEYS, name)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def finished_requests(server):
    return sum(server.metric("pagedserve_requests_finished_total", f'finish_reason="{r}"')
               for r in ("stop", "length", "abort", "error"))


def cert(name):
    return zmq.auth.load_certificate(os.path.join(KEYS, name))


class CurveServer(ServerProcess):
    """A ServerProcess whose health wait talks CURVE as `alice`."""

    def __init__(self, extra, client_kwargs):
        self.client_kwargs = client_kwargs
        super().__init__(extra)

    def wait_healthy(self):
        deadline = time.monotonic() + serve_test.START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.logs()}")
            try:
                with pagedserve_client.Client(self.endpoint, timeout=1.0, **self.client_kwargs) as c:
                    if c.health():
                        return
            except pagedserve_client.PagedServeError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not healthy within {serve_test.START_TIMEOUT} s:\n{self.logs()}")


def setUpModule():
    global KEYS
    KEYS = tempfile.mkdtemp(prefix="pagedserve-security-")
    os.mkdir(os.path.join(KEYS, "clients"))
    keygen("server")
    keygen("clients/alice")
    keygen("mallory")
    # A key made by another ZeroMQ tool (pyzmq) is read by the server too.
    zmq.auth.create_certificates(os.path.join(KEYS, "clients"), "carol")


def tearDownModule():
    shutil.rmtree(KEYS, ignore_errors=True)


def stop_ok(test, server):
    rc = server.stop()
    test.assertEqual(rc, 0, server.logs())


class KeygenTest(unittest.TestCase):
    def test_files_are_zeromq_certificates(self):
        public, secret = cert("server.key_secret")
        self.assertEqual(len(public), 40)
        self.assertEqual(len(secret), 40)
        self.assertEqual(cert("server.key"), (public, None))
        self.assertEqual(os.stat(os.path.join(KEYS, "server.key_secret")).st_mode & 0o777, 0o600)
        self.assertEqual(zmq.curve_public(secret), public, "pyzmq derives the same public key")
        r = subprocess.run([ARGS.pagedserve, "keygen", os.path.join(KEYS, "server")], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 1, "existing keys are never overwritten")
        self.assertIn("never overwritten", r.stderr)


class CurveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server_public, _ = cert("server.key")
        a_pub, a_sec = cert("clients/alice.key_secret")
        cls.alice = dict(curve_server_key=cls.server_public, curve_public_key=a_pub, curve_secret_key=a_sec)
        cls.server = CurveServer(
            ["--enable-prefix-caching", f"--zmq-curve-secret-key-file={KEYS}/server.key_secret",
             f"--zmq-curve-authorized-clients={KEYS}/clients"], cls.alice)

    @classmethod
    def tearDownClass(cls):
        stop_ok(unittest.TestCase(), cls.server)

    def client(self, timeout=serve_test.REPLY_TIMEOUT, **kwargs):
        return pagedserve_client.Client(self.server.endpoint, timeout=timeout, **(kwargs or self.alice))

    def served_snapshot(self):
        # Idle first: a finished request's blocks are released by the engine's next step.
        deadline = time.monotonic() + serve_test.REPLY_TIMEOUT
        with self.client() as c:
            s = c.stats()
            while (s["num_running"], s["num_waiting"], s["kv_blocks_used"]) != (0, 0, 0) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
                s = c.stats()
        return dict(running=s["num_running"], waiting=s["num_waiting"], kv_used=s["kv_blocks_used"],
                    finished=finished_requests(self.server),
                    prompt_tokens=self.server.metric("pagedserve_prompt_tokens_total"),
                    log_lines=self.server.logs().count("request zmq:"))

    def test_listed_clients_are_served(self):
        with self.client() as c:
            out = c.generate(PROMPT, max_tokens=8, temperature=0)
        self.assertEqual(out.outputs[0].finish_reason, "length")
        self.assertEqual(out.usage["completion_tokens"], 8)
        c_pub, c_sec = cert("clients/carol.key_secret")  # made by pyzmq
        with self.client(curve_server_key=self.server_public, curve_public_key=c_pub, curve_secret_key=c_sec) as c:
            self.assertTrue(c.health())
        r = subprocess.run([ARGS.pagedserve, "client", f"--zmq-endpoint={self.server.endpoint}",
                            f"--zmq-curve-server-key-file={KEYS}/server.key",
                            f"--zmq-curve-secret-key-file={KEYS}/clients/alice.key_secret",
                            "--max-tokens=4", "--temperature=0", "--client-timeout=60", PROMPT],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("completion_tokens=4", r.stderr)

    def handshakes_failed(self, reason):
        return self.server.metric("pagedserve_zmq_handshakes_failed_total", f'reason="{reason}"')

    def test_refused_clients_get_nothing_and_cost_nothing(self):
        before = self.served_snapshot()
        refused_before = {r: self.handshakes_failed(r) for r in ("auth", "protocol")}
        m_pub, m_sec = cert("mallory.key_secret")
        a_pub, a_sec = cert("clients/alice.key_secret")
        wrong_server = m_pub
        cases = {
            "no CURVE": {},
            "wrong server key": dict(curve_server_key=wrong_server, curve_public_key=a_pub, curve_secret_key=a_sec),
            "unlisted client key": dict(curve_server_key=self.server_public, curve_public_key=m_pub,
                                        curve_secret_key=m_sec),
            "fresh client key": dict(curve_server_key=self.server_public),
        }
        for name, kwargs in cases.items():
            with pagedserve_client.Client(self.server.endpoint, timeout=2.0, **kwargs) as c:
                with self.assertRaises(pagedserve_client.PagedServeTimeout, msg=name):
                    c.generate(PROMPT, max_tokens=64, temperature=0)
                with self.assertRaises(pagedserve_client.PagedServeTimeout, msg=name):
                    c.health()
        # The CLI client reports the silence with a hint.
        r = subprocess.run([ARGS.pagedserve, "client", "--health", f"--zmq-endpoint={self.server.endpoint}",
                            f"--zmq-curve-server-key-file={KEYS}/mallory.key", "--client-timeout=1"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("wrong server key", r.stderr)
        after = self.served_snapshot()
        self.assertEqual(after, before, "a refused client changed the server's state")
        self.assertEqual((after["running"], after["waiting"], after["kv_used"]), (0, 0, 0))
        self.assertRegex(self.server.logs(), r"CURVE handshakes refused so far: \d+")
        # ... but each refusal is counted, by reason: an unlisted or fresh key is
        # refused by the ZAP handler ("auth"); no CURVE or a wrong server key
        # fails the CURVE handshake itself ("protocol").
        deadline = time.monotonic() + serve_test.REPLY_TIMEOUT
        while time.monotonic() < deadline and not (
                self.handshakes_failed("auth") >= refused_before["auth"] + 2 and
                self.handshakes_failed("protocol") >= refused_before["protocol"] + 3):
            time.sleep(0.1)
        self.assertGreaterEqual(self.handshakes_failed("auth"), refused_before["auth"] + 2)
        self.assertGreaterEqual(self.handshakes_failed("protocol"), refused_before["protocol"] + 3)

    def test_handshake_flood_does_not_slow_served_clients(self):
        """200 connections with unlisted keys fail the handshake again and again (each
        refusal costs the server a full CURVE handshake and a ZAP round trip; a refused
        socket is closed and a new one takes its place) while alice is served.
        Bound: each run of alice's (repeated while the flood makes 200 more attempts)
        takes at most 3x its unflooded time + 3 s (generous: the
        2-core CI machine is shared; a server that parsed or queued refused traffic, or a
        ZAP handler that blocked the I/O thread, would exceed it by far)."""
        def alice_run():
            start = time.monotonic()
            with self.client() as c:
                for i in range(2):
                    out = c.generate(PROMPT + f" {i}", max_tokens=4, temperature=0, ignore_eos=True)
                    self.assertEqual(out.usage["completion_tokens"], 4)
            return time.monotonic() - start

        def refusals():
            found = re.findall(r"CURVE handshakes refused so far: (\d+)", self.server.logs())
            return max([int(n) for n in found] or [0])

        stop = threading.Event()
        attempts = [0]

        def flood():
            ctx = zmq.Context()
            keys = [zmq.curve_keypair() for _ in range(200)]
            socks = [None] * 200
            try:
                while not stop.is_set():
                    for i, (pub, sec) in enumerate(keys):
                        if stop.is_set():
                            break
                        if socks[i] is not None:
                            socks[i].close(0)
                        s = ctx.socket(zmq.DEALER)
                        s.linger = 0
                        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = self.server_public, pub, sec
                        s.connect(self.server.endpoint)
                        s.send(b'{"version":1,"type":"stats","id":"flood"}', zmq.NOBLOCK)
                        socks[i] = s
                        attempts[0] += 1
                        time.sleep(0.002)
            finally:
                for s in socks:
                    if s is not None:
                        s.close(0)
                ctx.term()

        alice_run()  # warm-up
        baseline = alice_run()
        before = refusals()
        finished_before = finished_requests(self.server)
        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        try:
            deadline = time.monotonic() + 60
            while refusals() < before + 256 and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertGreaterEqual(refusals(), before + 256, "the flood never reached the server")
            # Alice's runs are short: repeat them until the flood has made 200 more
            # handshake attempts, so that every run overlaps the flood.
            at_start = attempts[0]
            flooded_runs = []
            deadline = time.monotonic() + 120
            while (not flooded_runs or attempts[0] < at_start + 200) and time.monotonic() < deadline:
                flooded_runs.append(alice_run())
            self.assertTrue(flooder.is_alive(), "the flood stopped before alice's runs ended")
            self.assertGreaterEqual(attempts[0], at_start + 200, "the flood made too few attempts")
            flooded = max(flooded_runs)
        finally:
            stop.set()
            flooder.join(60)
        print(f"\nalice: {baseline:.2f} s unflooded, {flooded:.2f} s under a flood of {attempts[0]} "
              f"handshakes ({refusals()} refusals logged so far)", file=sys.stderr)
        self.assertLess(flooded, 3 * baseline + 3.0)
        self.assertEqual(finished_requests(self.server) - finished_before, 2 * len(flooded_runs),
                         "only alice's requests were served")

    def test_request_log_has_no_content_by_default(self):
        with self.client() as c:
            c.generate("zebra quartz lantern " * 3, max_tokens=4, temperature=0, request_id="log-check")
        logs = self.server.logs()
        line = [l for l in logs.splitlines() if "request zmq:" in l and "/log-check" in l]
        self.assertEqual(len(line), 1, logs[-2000:])
        self.assertRegex(line[0], r"prompt_tokens=\d+ completion_tokens=4 cached_prompt_tokens=\d+ "
                                  r"finish_reason=length e2e_s=[0-9.]+")
        self.assertNotIn("zebra", logs)
        self.assertNotIn("prompt=", line[0])


class CacheSaltTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(["--enable-prefix-caching", "--log-request-content"])
        cls.strict = ServerProcess(["--enable-prefix-caching", "--require-cache-salt"])

    @classmethod
    def tearDownClass(cls):
        stop_ok(unittest.TestCase(), cls.server)
        stop_ok(unittest.TestCase(), cls.strict)

    def gen(self, server, salt, prompt=PROMPT):
        hits = server.metric("pagedserve_prefix_cache_hits_tokens_total")
        with pagedserve_client.Client(server.endpoint, timeout=serve_test.REPLY_TIMEOUT) as c:
            kwargs = {} if salt is None else dict(cache_salt=salt)
            out = c.generate(prompt, max_tokens=8, temperature=0, **kwargs)
        return out, server.metric("pagedserve_prefix_cache_hits_tokens_total") - hits

    def test_salts_never_share_blocks_and_one_salt_does(self):
        prompt = PROMPT + " and then " + PROMPT
        a1, hits_a1 = self.gen(self.server, "tenant-a", prompt)
        self.assertGreater(a1.usage["prompt_tokens"], 32, "the prompt must span two full blocks")
        b1, hits_b1 = self.gen(self.server, "tenant-b", prompt)
        plain, hits_plain = self.gen(self.server, None, prompt)
        a2, hits_a2 = self.gen(self.server, "tenant-a", prompt)
        self.assertEqual((a1.usage["cached_prompt_tokens"], hits_a1), (0, 0))
        self.assertEqual((b1.usage["cached_prompt_tokens"], hits_b1), (0, 0), "hit across salts")
        self.assertEqual((plain.usage["cached_prompt_tokens"], hits_plain), (0, 0), "unsalted hit a salted prefix")
        self.assertGreaterEqual(a2.usage["cached_prompt_tokens"], 32, "the same salt must hit")
        self.assertEqual(hits_a2, a2.usage["cached_prompt_tokens"])
        texts = {o.outputs[0].text for o in (a1, b1, plain, a2)}
        self.assertEqual(len(texts), 1, f"greedy output differs across salts: {texts}")
        ids = {tuple(o.outputs[0].token_ids) for o in (a1, b1, plain, a2)}
        self.assertEqual(len(ids), 1)

    def test_malformed_salt_is_refused_and_the_server_keeps_serving(self):
        with pagedserve_client.Client(self.server.endpoint, timeout=serve_test.REPLY_TIMEOUT) as c:
            for salt, needle in [("", "non-empty"), ("x" * 257, "at most 256"), ("tenant a", "byte 6 is 0x20"),
                                 ("caf\u00e9", "byte 3 is 0xC3"), (7, "must be a string")]:
                with self.assertRaises(pagedserve_client.PagedServeError) as e:
                    c.generate(PROMPT, max_tokens=2, cache_salt=salt)
                self.assertEqual(e.exception.code, "invalid_request")
                self.assertIn(needle, e.exception.message)
            self.assertTrue(c.health())
            out = c.generate(PROMPT, max_tokens=2, temperature=0, cache_salt="x" * 256)
            self.assertEqual(out.usage["completion_tokens"], 2)

    def test_require_cache_salt(self):
        with pagedserve_client.Client(self.strict.endpoint, timeout=serve_test.REPLY_TIMEOUT) as c:
            with self.assertRaises(pagedserve_client.PagedServeError) as e:
                c.generate(PROMPT, max_tokens=2)
            self.assertEqual(e.exception.code, "invalid_request")
            self.assertIn("cache_salt is required", e.exception.message)
            out = c.generate(PROMPT, max_tokens=2, cache_salt="tenant-a")
            self.assertEqual(out.usage["completion_tokens"], 2)
            # A finished request's blocks are released by the engine's next step.
            deadline = time.monotonic() + serve_test.REPLY_TIMEOUT
            while c.stats()["kv_blocks_used"] != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(c.stats()["kv_blocks_used"], 0)

    def test_log_request_content_writes_the_text(self):
        out, _ = self.gen(self.server, "tenant-log", "zebra quartz lantern")
        lines = [l for l in self.server.logs().splitlines() if "request zmq:" in l and "zebra quartz lantern" in l]
        self.assertEqual(len(lines), 1)
        self.assertIn("completion[0]=\"", lines[0])
        self.assertNotIn("tenant-log", self.server.logs(), "the salt itself is never logged")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--pagedserve", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    serve_test.ARGS = argparse.Namespace(pagedserve=ARGS.pagedserve, model=ARGS.model, mpirun=False)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
