#!/usr/bin/env python3
"""The soak's server handling (tests/soak/soak.py, class Server) against a fake
`pagedserve serve`: a small HTTP server that answers /health and answers
/metrics as a plan file says (drop the connection, a truncated body, a page
that does not parse, or a good page). No model, no build: a few seconds.

  * the first /metrics read of a new server (the 5xx baseline the soak judges
    every later 5xx against) is retried through transient failures and gives
    the baseline of the first good page;
  * a server whose /metrics never reads is refused with an error naming it,
    and is stopped, not left running;
  * a periodic sample (snapshot) survives a truncated page.
"""

import argparse
import importlib.util
import os
import stat
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("soak", os.path.join(HERE, "soak.py"))
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)

FAKE = textwrap.dedent('''\
    #!/usr/bin/env python3
    # A fake `pagedserve serve` for soak_server_test.py: --port, --pid-file; FAKE_PLAN
    # lists the answers to successive /metrics requests (the last one repeats),
    # FAKE_HITS counts them, FAKE_PID receives the pid.
    import http.server, os, sys
    opts = dict(a[2:].split("=", 1) for a in sys.argv if a.startswith("--") and "=" in a)
    open(os.environ["FAKE_PID"], "w").write(str(os.getpid()))
    open(opts["pid-file"], "w").write(str(os.getpid()))
    PAGE = (b'# TYPE pagedserve_http_responses_total counter\\n'
            b'pagedserve_http_responses_total{status="503"} 3\\n'
            b'pagedserve_http_responses_total{status="200"} 7\\n'
            b'pagedserve_kv_cache_usage_ratio{pool="device"} 0\\n')
    hits = 0

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, body, length=None):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            global hits
            if self.path == "/health":
                return self.send(b"ok")
            plan = open(os.environ["FAKE_PLAN"]).read().split()
            step = plan[min(hits, len(plan) - 1)]
            hits += 1
            open(os.environ["FAKE_HITS"], "w").write(str(hits))
            self.close_connection = True
            if step == "drop":
                return  # no response at all: the client sees the connection closed
            if step == "truncate":
                return self.send(PAGE[:40], length=len(PAGE))
            if step == "garbage":
                return self.send(b"pagedserve_http_responses_total\\n")
            self.send(PAGE)

    http.server.HTTPServer(("127.0.0.1", int(opts["port"])), H).serve_forever()
    ''')


class SoakServerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        self.fake = os.path.join(d, "pagedserve")
        with open(self.fake, "w") as f:
            f.write(FAKE)
        os.chmod(self.fake, os.stat(self.fake).st_mode | stat.S_IEXEC)
        self.plan, self.hits, self.pid = (os.path.join(d, n) for n in ("plan", "hits", "pid"))
        os.environ.update(FAKE_PLAN=self.plan, FAKE_HITS=self.hits, FAKE_PID=self.pid)
        self.args = argparse.Namespace(pagedserve=self.fake, model="none", max_model_len=512,
                                       max_num_blocks=40, tp=1)

    def tearDown(self):
        # The fake is this test's own process: never left behind, whatever failed.
        try:
            os.kill(int(open(self.pid).read()), 9)
        except (OSError, ValueError):
            pass
        self.tmp.cleanup()

    def write_plan(self, *steps):
        with open(self.plan, "w") as f:
            f.write("\n".join(steps))

    def count(self):
        return int(open(self.hits).read())

    def test_first_metrics_read_retries_transient_failures(self):
        self.write_plan("drop", "truncate", "garbage", "ok")
        server = soak.Server(self.args)
        try:
            self.assertEqual(server.ready_5xx, 3)
            self.assertEqual(self.count(), 4, "one read per plan step, the good page last")
            # A periodic sample keeps going through a truncated page (it goes
            # without the page's figures) and reads them once the page is whole.
            self.write_plan("truncate")
            sample = soak.snapshot(server)
            self.assertIn("rss", sample)
            self.assertNotIn("kv", sample)
            self.write_plan("ok")
            self.assertEqual(soak.snapshot(server)["kv"], 0)
        finally:
            server.stop()

    def test_unreadable_metrics_fail_the_start_and_stop_the_server(self):
        self.write_plan("drop")
        saved = getattr(soak, "METRICS_READ_TIMEOUT", None)
        soak.METRICS_READ_TIMEOUT = 2.0
        try:
            with self.assertRaisesRegex(RuntimeError, "/metrics not readable within 2.0 s"):
                soak.Server(self.args)
        finally:
            soak.METRICS_READ_TIMEOUT = saved
            pid = int(open(self.pid).read())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)
        self.assertFalse(os.path.exists(f"/proc/{pid}"), "the fake server was left running")
        self.assertGreater(self.count(), 1, "the read was retried")


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)
