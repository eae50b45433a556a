#!/usr/bin/env python3
"""Security of the HTTP API (docs/security.md), end to end against real servers.

- TLS: a self-signed certificate made with the `openssl` command line; the server runs
  with --ssl-certfile / --ssl-keyfile. The `openai` client that trusts the certificate
  (its httpx client, openai.DefaultHttpxClient, with verify= an SSL context whose
  CA file is the certificate) is served, streaming and not; a client that does not trust it, and
  a plain-HTTP client on the same port, are not. A certificate without its key, or with
  another key, stops the server at start with an error naming the flags.
- Mutual TLS (--ssl-ca-certs, --ssl-cert-reqs as uvicorn / vLLM name them): a test CA
  made with `openssl` signs one client certificate; a second client certificate is
  self-signed. With --ssl-cert-reqs 2 the signed client is served (openai client and
  /health) and a client without a certificate or with the self-signed one is not; with
  1 a client without a certificate is served and the self-signed one is not. Bad
  combinations of the flags stop the server at start naming the flag.
- cache_salt on /v1/completions and /v1/chat/completions: the same prompt under two
  salts gets zero cached prompt tokens across salts (usage.prompt_tokens_details and
  the prefix-cache hit metric), under one salt it gets hits; an unsalted request never
  hits a salted one's blocks; greedy output is the same either way; a malformed salt is
  a 400 naming `cache_salt` that does not echo the salt, and the server keeps serving;
  --require-cache-salt refuses unsalted requests.
- Request log: a completion's and a chat's log lines carry ids and counts, never the
  prompt or the completion, without --log-request-content.

  http_security_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL.gguf
"""
import argparse
import http.client as httpclient
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import http_test  # noqa: E402  (exits 77 when the openai package is missing)
from http_test import ServerProcess, http, metric  # noqa: E402

import openai  # noqa: E402

ARGS = None
CERTS = None  # temporary folder: cert.pem, key.pem, other_key.pem
# About 110 tokens: several full 16-token KV blocks to be cached.
PROMPT = ("Salted prefix caching keeps tenants apart. " +
          "The quick brown fox jumps over the lazy dog near the old river bank while seven zebras "
          "quietly paint purple quartz lanterns under a sleepy moon. " * 4)


def openssl(*args):
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def setUpModule():
    global CERTS
    CERTS = tempfile.mkdtemp(prefix="pagedserve-tls-")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", os.path.join(CERTS, "key.pem"), "-out", os.path.join(CERTS, "cert.pem"))
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
            "-out", os.path.join(CERTS, "other_key.pem"))
    # Mutual TLS: a CA, a client certificate it signs, and a self-signed one.
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=pagedserve test CA",
            "-keyout", os.path.join(CERTS, "ca_key.pem"), "-out", os.path.join(CERTS, "ca.pem"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=gateway", "-keyout",
            os.path.join(CERTS, "client_key.pem"), "-out", os.path.join(CERTS, "client.csr"))
    openssl("x509", "-req", "-in", os.path.join(CERTS, "client.csr"), "-CA", os.path.join(CERTS, "ca.pem"),
            "-CAkey", os.path.join(CERTS, "ca_key.pem"), "-CAcreateserial", "-days", "2",
            "-out", os.path.join(CERTS, "client.pem"))
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gateway",
            "-keyout", os.path.join(CERTS, "rogue_key.pem"), "-out", os.path.join(CERTS, "rogue.pem"))


def tearDownModule():
    shutil.rmtree(CERTS, ignore_errors=True)


def cert(name):
    return os.path.join(CERTS, name)


def serve_fails(*flags):
    """Runs `pagedserve serve` expecting it to stop at start; returns its output."""
    r = subprocess.run([ARGS.pagedserve, "serve", f"--model={ARGS.model}", "--port=0",
                        f"--zmq-endpoint=tcp://127.0.0.1:{http_test.free_port()}", *flags],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trusted = ssl.create_default_context(cafile=cert("cert.pem"))
        cls.server = ServerProcess([f"--ssl-certfile={cert('cert.pem')}", f"--ssl-keyfile={cert('key.pem')}"],
                                   ssl_context=cls.trusted)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def client(self, verify):
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key="none", max_retries=0, timeout=120,
                             http_client=openai.DefaultHttpxClient(verify=verify))

    def test_served_over_https_to_a_client_that_trusts_the_certificate(self):
        self.assertTrue(self.server.url.startswith("https://127.0.0.1:"), self.server.url)
        c = self.client(self.trusted)
        r = c.completions.create(model=self.server.model, prompt="Once upon a time", max_tokens=8,
                                 temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 8)
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model=self.server.model, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True,
            extra_body={"ignore_eos": True}))
        self.assertEqual(streamed, r.choices[0].text)
        status, body = http("GET", self.server.url + "/health", context=self.trusted)
        self.assertEqual(status, 200, body)

    def test_untrusting_and_plain_http_clients_are_not_served(self):
        with self.assertRaises(openai.APIConnectionError):
            self.client(True).models.list()  # the system CAs do not include the self-signed one
        port = int(self.server.url.rsplit(":", 1)[1])
        conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=30)
        with self.assertRaises((ConnectionError, httpclient.HTTPException, OSError)):
            conn.request("GET", "/health")
            conn.getresponse()
        conn.close()
        # Still serving TLS clients afterwards.
        status, _ = http("GET", self.server.url + "/health", context=self.trusted)
        self.assertEqual(status, 200)

    def test_bad_certificate_flags_stop_the_server(self):
        rc, out = serve_fails(f"--ssl-certfile={cert('cert.pem')}")
        self.assertNotEqual(rc, 0)
        self.assertIn("--ssl-certfile and --ssl-keyfile go together", out)
        rc, out = serve_fails(f"--ssl-certfile={cert('cert.pem')}", f"--ssl-keyfile={cert('other_key.pem')}")
        self.assertNotEqual(rc, 0)
        self.assertIn("not a PEM certificate and its matching private key", out)
        rc, out = serve_fails(f"--ssl-certfile={cert('missing.pem')}", f"--ssl-keyfile={cert('key.pem')}")
        self.assertNotEqual(rc, 0)
        self.assertIn("--ssl-certfile " + cert("missing.pem"), out)


def client_context(cert_name=None):
    """Trusts the server's certificate; presents CERTS/<cert_name>.pem when given."""
    ctx = ssl.create_default_context(cafile=cert("cert.pem"))
    if cert_name:
        ctx.load_cert_chain(cert(cert_name + ".pem"), cert(cert_name + "_key.pem"))
    return ctx


class MutualTlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tls = [f"--ssl-certfile={cert('cert.pem')}", f"--ssl-keyfile={cert('key.pem')}",
               f"--ssl-ca-certs={cert('ca.pem')}"]
        cls.required = ServerProcess(tls + ["--ssl-cert-reqs=2"], ssl_context=client_context("client"))
        cls.optional = ServerProcess(tls + ["--ssl-cert-reqs=1"], ssl_context=client_context())

    @classmethod
    def tearDownClass(cls):
        cls.required.stop()
        cls.optional.stop()

    def served(self, server, ctx):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120,
                          http_client=openai.DefaultHttpxClient(verify=ctx))
        r = c.completions.create(model=server.model, prompt="Once upon a time", max_tokens=4, temperature=0,
                                 extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 4)
        status, body = http("GET", server.url + "/health", context=ctx)
        self.assertEqual(status, 200, body)

    def refused(self, server, ctx, what):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60,
                          http_client=openai.DefaultHttpxClient(verify=ctx))
        with self.assertRaises(openai.APIConnectionError, msg=what):
            c.models.list()
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError), msg=what):
            http("GET", server.url + "/health", context=ctx)

    def test_required_client_certificate(self):
        self.served(self.required, client_context("client"))
        self.refused(self.required, client_context(), "no client certificate")
        self.refused(self.required, client_context("rogue"), "a certificate the CA did not sign")
        self.served(self.required, client_context("client"))  # still serving

    def test_optional_client_certificate(self):
        self.served(self.optional, client_context())
        self.served(self.optional, client_context("client"))
        self.refused(self.optional, client_context("rogue"), "a certificate the CA did not sign")

    def test_bad_flags_stop_the_server(self):
        tls = [f"--ssl-certfile={cert('cert.pem')}", f"--ssl-keyfile={cert('key.pem')}"]
        rc, out = serve_fails(*tls, "--ssl-cert-reqs=3", f"--ssl-ca-certs={cert('ca.pem')}")
        self.assertNotEqual(rc, 0)
        self.assertIn("--ssl-cert-reqs must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED)", out)
        rc, out = serve_fails(*tls, "--ssl-cert-reqs=2")
        self.assertNotEqual(rc, 0)
        self.assertIn("--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs", out)
        rc, out = serve_fails(f"--ssl-ca-certs={cert('ca.pem')}", "--ssl-cert-reqs=2")
        self.assertNotEqual(rc, 0)
        self.assertIn("--ssl-ca-certs needs --ssl-certfile", out)
        rc, out = serve_fails(*tls, "--ssl-cert-reqs=2", f"--ssl-ca-certs={cert('other_key.pem')}")
        self.assertNotEqual(rc, 0)
        self.assertIn("--ssl-ca-certs " + cert("other_key.pem") + ": no PEM CA certificate loaded", out)


class CacheSaltTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(["--enable-prefix-caching"])
        cls.c = cls.server.client()

    def test_request_log_has_no_content_by_default(self):
        """What leaves the process: the HTTP front end's request log line carries the
        id and the counts, never the prompt or the completion (no
        --log-request-content on this server)."""
        r = self.c.completions.create(model=self.server.model, prompt="zebra quartz lantern", max_tokens=4,
                                      temperature=0, extra_body={"ignore_eos": True})
        chat = self.c.chat.completions.create(model=self.server.model, max_tokens=4, temperature=0,
                                              messages=[{"role": "user", "content": "zebra quartz lantern"}])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(f'id="{x.id}"' in self.server.logs() for x in (r, chat)):
            time.sleep(0.05)
        logs = self.server.logs()
        for x, completion in ((r, r.choices[0].text), (chat, chat.choices[0].message.content)):
            lines = [l for l in logs.splitlines() if "request http:" in l and f'id="{x.id}"' in l]
            self.assertEqual(len(lines), 1, logs[-2000:])
            self.assertRegex(lines[0], r"prompt_tokens=\d+ completion_tokens=4 ")
            self.assertNotIn("prompt=", lines[0])
            if completion.strip():
                self.assertNotIn(completion.strip(), logs)
        self.assertNotIn("zebra", logs)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def complete(self, prompt, salt=None):
        extra = {"ignore_eos": True}
        if salt is not None:
            extra["cache_salt"] = salt
        r = self.c.completions.create(model=self.server.model, prompt=prompt, max_tokens=6, temperature=0,
                                      extra_body=extra)
        return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens

    def hits(self):
        return metric(self.server.url, "pagedserve_prefix_cache_hits_tokens_total")

    def test_completions_salts_share_nothing_across_and_everything_within(self):
        prompt = "Completions. " + PROMPT
        text_a, cached = self.complete(prompt, "tenant-a")
        self.assertEqual(cached, 0)
        hits_before = self.hits()
        text_b, cached_b = self.complete(prompt, "tenant-b")
        self.assertEqual(cached_b, 0, "a request with another salt hit tenant-a's blocks")
        text_none, cached_none = self.complete(prompt)
        self.assertEqual(cached_none, 0, "an unsalted request hit a salted request's blocks")
        self.assertEqual(self.hits(), hits_before, "prefix-cache hits across salts")
        text_a2, cached_a2 = self.complete(prompt, "tenant-a")
        self.assertGreaterEqual(cached_a2, 64, "the same salt must share the cached prefix")
        self.assertGreater(self.hits(), hits_before)
        self.assertEqual({text_a, text_b, text_none, text_a2}, {text_a}, "the salt changed the output")

    def test_chat_completions_carry_the_salt(self):
        messages = [{"role": "user", "content": "Chat. " + PROMPT}]

        def chat(salt):
            r = self.c.chat.completions.create(model=self.server.model, messages=messages, max_tokens=6,
                                               temperature=0, extra_body={"cache_salt": salt})
            return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens

        text_x, cached = chat("chat-x")
        self.assertEqual(cached, 0)
        text_y, cached_y = chat("chat-y")
        self.assertEqual(cached_y, 0, "a chat with another salt hit chat-x's blocks")
        text_x2, cached_x2 = chat("chat-x")
        self.assertGreaterEqual(cached_x2, 64)
        self.assertEqual({text_x, text_y, text_x2}, {text_x})

    def test_malformed_salts_are_refused_without_echo_and_serving_goes_on(self):
        url = self.server.url + "/v1/completions"
        for salt, why in [("has space", "0x20"), ("", "non-empty"), ("s" * 257, "257 bytes"),
                          ("caf\u00e9", "0xC3"), (42, "must be a string")]:
            status, body = http("POST", url, {"model": self.server.model, "prompt": "hi", "max_tokens": 1,
                                              "cache_salt": salt})
            self.assertEqual(status, 400, (salt, body))
            self.assertEqual(body["error"]["param"], "cache_salt", body)
            self.assertIn(why, body["error"]["message"])
            if isinstance(salt, str) and len(salt) > 3:
                self.assertNotIn(salt, body["error"]["message"], "the salt was echoed")
        status, body = http("POST", self.server.url + "/v1/chat/completions",
                            {"model": self.server.model, "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 1, "cache_salt": "bad salt"})
        self.assertEqual((status, body["error"]["param"]), (400, "cache_salt"), body)
        text, _ = self.complete("Still serving?", "ok-salt")
        self.assertTrue(text)


class RequireCacheSaltTest(unittest.TestCase):
    def test_unsalted_requests_are_refused(self):
        server = ServerProcess(["--require-cache-salt"])
        try:
            status, body = http("POST", server.url + "/v1/completions",
                                {"model": server.model, "prompt": "hi", "max_tokens": 1})
            self.assertEqual(status, 400, body)
            self.assertIn("cache_salt is required", body["error"]["message"])
            status, body = http("POST", server.url + "/v1/completions",
                                {"model": server.model, "prompt": "hi", "max_tokens": 1, "cache_salt": "t1"})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["usage"]["completion_tokens"], 1)
        finally:
            server.stop()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagedserve", required=True)
    ap.add_argument("--model", required=True)
    ARGS, rest = ap.parse_known_args()
    http_test.require_model("http_security_test", ARGS.model)
    http_test.ARGS = ARGS
    if shutil.which("openssl") is None:
        sys.exit("http_security_test: the openssl command line is missing (apt-get install openssl)")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
