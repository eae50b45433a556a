#!/usr/bin/env python3
"""Metrics of a REAL `pagedserve serve` process (CTest label `monitoring`).

    serve_metrics_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL_DIR [-k PATTERN]

The library tests (metrics_test, promtool_test, prometheus_test) feed Metrics
with a synthetic workload; this driver checks the wiring in the engine and the
serve command instead. It starts `pagedserve serve` on the random-weight Llama
fixture (free loopback ports, bounded start-up, killed on the way out), plays a
known workload over ZeroMQ (pyzmq DEALER sockets, protocol v1), scrapes
/metrics and compares every figure with what the clients were told:

  WorkloadTest      12 requests with pairwise different first blocks (some
                    n = 2, one aborted): generation tokens == sum of
                    completion_tokens, prompt tokens == sum of prompt_tokens,
                    finished requests by reason count requests (n = 2 once),
                    TTFT _count == requests that produced a token, ITL _count ==
                    tokens - 1 per sequence, every histogram cumulative with
                    _count == +Inf bucket, gauges (running, waiting, swapped,
                    KV usage of both pools) back to 0 after the drain;
                    `promtool check metrics` on the live endpoint reports
                    nothing; a real Prometheus (loopback, temporary data
                    directory) scrapes the server and PromQL through
                    /api/v1/query returns the known totals.
  PreemptionTest    --enable-prefix-caching, recompute preemption and a pool
                    of 10 blocks: requests are preempted and recomputed
                    (preemptions_total{mode="recompute"} > 0, prompt tokens >
                    sum of prompt lengths), yet prefix-cache hits stay exactly 0
                    and queries equal the sum of prompt lengths: a request
                    re-admitted after a recompute preemption finds its own
                    blocks, which is not counted as a prefix hit
                    (docs/metrics.md).

Exit code 77 (CTest SKIP_RETURN_CODE) when pyzmq is missing; a missing
promtool or prometheus (Debian package `prometheus`) fails its test.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

try:
    import zmq
except ImportError:  # pragma: no cover
    # Exit 77 = skipped; 1 where PAGEDSERVE_ALLOWED_SKIPS (scripts/test: the
    # no-GPU reasons only) does not allow this reason.
    _reason = "pyzmq not installed (scripts/install-deps)"
    _allowed = os.environ.get("PAGEDSERVE_ALLOWED_SKIPS")
    print(("SKIP NOT ALLOWED (PAGEDSERVE_ALLOWED_SKIPS): " if _allowed is not None and
           not re.search(_allowed, _reason) else "skipped: ") + _reason, file=sys.stderr)
    sys.exit(1 if _allowed is not None and not re.search(_allowed, _reason) else 77)

ARGS = None
# Waiting bounds, multiplied by PAGEDSERVE_TEST_TIME_SCALE (default 1) on a slow
# or shared machine: they are there so that a hang fails, not to time anything.
TIME_SCALE = max(1.0, float(os.environ.get("PAGEDSERVE_TEST_TIME_SCALE", "1") or 1))
START_TIMEOUT = 120.0 * TIME_SCALE
REPLY_TIMEOUT = 120.0 * TIME_SCALE
DRAIN_TIMEOUT = 15.0 * TIME_SCALE


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read().decode()


# --- Prometheus text format -------------------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def served_model_name():
    """What serve labels every series with: the --model path's last component."""
    return os.path.basename(ARGS.model.rstrip("/"))


def parse_metrics(text):
    """{(name, frozenset(labels.items())): value} of every sample. Every
    pagedserve_* series must carry model_name = served_model_name(); that label
    is checked here and left out of the keys."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise AssertionError(f"unparsable sample line: {line!r}")
        labels = dict(LABEL.findall(m.group(3) or ""))
        if m.group(1).startswith("pagedserve_"):
            got = labels.pop("model_name", None)
            if got != served_model_name():
                raise AssertionError(f"{line!r}: model_name {got!r}, expected {served_model_name()!r}")
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(4))
    return out


def value(samples, name, **labels):
    key = (name, frozenset(labels.items()))
    if key not in samples:
        raise AssertionError(f"series {name}{labels} missing")
    return samples[key]


def histograms(samples):
    """{(name, other labels): [(le, cumulative count)], _count, _sum} of every histogram."""
    hs = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        if name.endswith("_bucket") and "le" in d:
            le = d.pop("le")
            key = (name[: -len("_bucket")], frozenset(d.items()))
            hs.setdefault(key, {"buckets": [], "count": None, "sum": None})
            hs[key]["buckets"].append((float(le), v))
    for key, h in hs.items():
        name, labels = key
        h["count"] = samples.get((name + "_count", labels))
        h["sum"] = samples.get((name + "_sum", labels))
        h["buckets"].sort()
    return hs


# --- server -----------------------------------------------------------------

class Server:
    """A `pagedserve serve` process on free loopback ports, killed by stop()."""

    def __init__(self, extra=()):
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        cmd = [ARGS.pagedserve, "serve", f"--model={ARGS.model}", f"--zmq-endpoint={self.endpoint}",
               "--metrics-host=127.0.0.1", f"--metrics-port={self.metrics_port}", "--port=0"] + list(extra)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def logs(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        raw = Raw(self.endpoint)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.logs()}")
                raw.send({"version": 1, "type": "health", "id": "ready"})
                try:
                    if raw.recv(timeout=1.0).get("status") == "ok":
                        http_get(self.metrics_port, "/metrics")
                        return
                except (TimeoutError, OSError):
                    pass
                time.sleep(0.2)
            raise RuntimeError(f"server not ready within {START_TIMEOUT} s:\n{self.logs()}")
        finally:
            raw.close()

    def scrape(self):
        return http_get(self.metrics_port, "/metrics")

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(10)
        return self.proc.returncode


class Raw:
    """A DEALER socket speaking JSON (protocol v1, docs/protocol.md)."""

    def __init__(self, endpoint):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, obj):
        self.sock.send(json.dumps(obj).encode())

    def recv(self, timeout=REPLY_TIMEOUT):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply within {timeout} s")
        return json.loads(self.sock.recv())

    def close(self):
        self.sock.close(0)


def distinct_prompts(count, seed, min_len, max_len, block_size=16):
    """Token-id prompts whose first tokens all differ, so no two share a KV block."""
    rng = random.Random(seed)
    firsts = rng.sample(range(1000, 40000), count)
    return [[f] + [rng.randrange(1000, 40000) for _ in range(rng.randrange(min_len, max_len + 1) - 1)]
            for f in firsts]


def run_workload(server, requests, abort_id=None):
    """Sends every request on one socket; aborts abort_id after its first delta.

    requests: {id: generate fields}. Returns {id: {"final": msg, "tokens": [per-sequence token count]}}.
    """
    raw = Raw(server.endpoint)
    try:
        for rid, fields in requests.items():
            msg = {"version": 1, "type": "generate", "id": rid}
            msg.update(fields)
            raw.send(msg)
        done, tokens, aborted = {}, {rid: {} for rid in requests}, False
        while len(done) < len(requests):
            m = raw.recv()
            rid = m.get("id")
            if m["type"] == "error":
                raise AssertionError(f"error reply: {m}\n{server.logs()}")
            if m["type"] in ("delta", "final"):
                for o in m.get("outputs", []):
                    if m["type"] == "delta" or not requests[rid].get("stream"):
                        tokens[rid][o["index"]] = tokens[rid].get(o["index"], 0) + len(o.get("token_ids", []))
            if m["type"] == "delta" and rid == abort_id and not aborted:
                raw.send({"version": 1, "type": "abort", "id": abort_id})
                aborted = True
            if m["type"] == "final":
                done[rid] = {"final": m, "tokens": [tokens[rid][i] for i in sorted(tokens[rid])]}
        return done
    finally:
        raw.close()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got is True:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s: {got}")
        time.sleep(0.2)


def drained_gauges(server):
    """True once running, waiting, swapped and both KV usages are 0, else their values."""
    s = parse_metrics(server.scrape())
    got = {"running": value(s, "pagedserve_requests_running"),
           "waiting": value(s, "pagedserve_requests_waiting"),
           "swapped": value(s, "pagedserve_requests_swapped"),
           "kv_device": value(s, "pagedserve_kv_cache_usage_ratio", pool="device"),
           "kv_cpu": value(s, "pagedserve_kv_cache_usage_ratio", pool="cpu")}
    return True if all(v == 0 for v in got.values()) else got


class ServerTestCase(unittest.TestCase):
    SERVER_FLAGS = ()

    @classmethod
    def setUpClass(cls):
        cls.server = Server(cls.SERVER_FLAGS)
        try:
            cls.play()
        except BaseException:
            print(cls.server.logs(), file=sys.stderr)
            cls.server.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        # SIGTERM is a graceful shutdown: the server must exit 0.
        rc = cls.server.stop()
        if rc != 0:
            print(cls.server.logs(), file=sys.stderr)
            raise AssertionError(f"pagedserve serve exited with {rc} after SIGTERM")

    def check_histograms(self, samples):
        hs = histograms(samples)
        self.assertGreaterEqual(len(hs), 11, sorted(k[0] for k in hs))
        for (name, labels), h in hs.items():
            counts = [c for _, c in h["buckets"]]
            self.assertEqual(h["buckets"][-1][0], float("inf"), name)
            self.assertEqual(counts, sorted(counts), f"{name}{dict(labels)} buckets not cumulative")
            self.assertEqual(h["count"], counts[-1], f"{name}{dict(labels)}: _count != +Inf bucket")
            self.assertIsNotNone(h["sum"], name)
            if h["count"] == 0:
                self.assertEqual(h["sum"], 0, name)
        return hs


class WorkloadTest(ServerTestCase):
    # Pool large enough that nothing is preempted: every prompt token is
    # prefilled exactly once.
    # Prefix caching off (it is on by default): every prompt token is prefilled
    # and counted once, and nothing is looked up.
    SERVER_FLAGS = ("--max-model-len=256", "--kv-cache-memory=33554432", "--swap-space=0.0625",
                    "--no-enable-prefix-caching")
    MAX_TOKENS = 8

    @classmethod
    def play(cls):
        prompts = distinct_prompts(11, seed=7, min_len=5, max_len=40)
        reqs = {}
        for i, p in enumerate(prompts):
            fields = {"prompt_token_ids": p, "max_tokens": cls.MAX_TOKENS, "ignore_eos": True, "temperature": 0}
            if i % 4 == 1:  # 3 requests with n = 2 (sampled, seeded)
                fields.update(n=2, temperature=0.8, seed=100 + i)
            if i % 3 == 2:
                fields["stream"] = True
            reqs[f"r{i}"] = fields
        # Text prompt, aborted after its first token (long enough to still run then).
        reqs["abort"] = {"prompt": "Zebra crossings at midnight", "max_tokens": 200, "ignore_eos": True,
                         "temperature": 0, "stream": True}
        cls.requests = reqs
        cls.results = run_workload(cls.server, reqs, abort_id="abort")
        wait_for(lambda: drained_gauges(cls.server), DRAIN_TIMEOUT, "gauges not back to 0 after the drain")
        cls.text = cls.server.scrape()
        cls.samples = parse_metrics(cls.text)

    def test_clients_saw_the_expected_workload(self):
        reasons = {}
        for rid, r in self.results.items():
            outs = r["final"]["outputs"]
            self.assertEqual(len(outs), self.requests[rid].get("n", 1), rid)
            for o in outs:
                reasons[o["finish_reason"]] = reasons.get(o["finish_reason"], 0) + 1
            self.assertEqual(sum(r["tokens"]), r["final"]["usage"]["completion_tokens"], rid)
        self.assertEqual(reasons, {"length": 14, "abort": 1})
        ab = self.results["abort"]["final"]["usage"]["completion_tokens"]
        self.assertGreaterEqual(ab, 1)
        self.assertLess(ab, 200)

    def test_token_counters_equal_client_usage(self):
        s = self.samples
        self.assertEqual(value(s, "pagedserve_preemptions_total", mode="recompute"), 0)
        self.assertEqual(value(s, "pagedserve_preemptions_total", mode="swap"), 0)
        completion = sum(r["final"]["usage"]["completion_tokens"] for r in self.results.values())
        prompt = sum(r["final"]["usage"]["prompt_tokens"] for r in self.results.values())
        self.assertEqual(completion, 14 * self.MAX_TOKENS + self.results["abort"]["final"]["usage"]["completion_tokens"])
        self.assertEqual(value(s, "pagedserve_generation_tokens_total"), completion)
        # No preemption: every prompt token prefilled once, an n = 2 prompt once.
        self.assertEqual(value(s, "pagedserve_prompt_tokens_total"), prompt)
        self.assertEqual(value(s, "pagedserve_request_generation_tokens_sum"), completion)
        self.assertEqual(value(s, "pagedserve_request_prompt_tokens_sum"), prompt)
        # Prefix caching is off: nothing looked up.
        self.assertEqual(value(s, "pagedserve_prefix_cache_queries_tokens_total"), 0)
        self.assertEqual(value(s, "pagedserve_prefix_cache_hits_tokens_total"), 0)
        self.assertNotIn("pagedserve_metrics_rejected_observations_total", self.text)

    def test_finished_requests_count_requests_not_sequences(self):
        s = self.samples
        self.assertEqual(value(s, "pagedserve_requests_finished_total", finish_reason="length"), 11)
        self.assertEqual(value(s, "pagedserve_requests_finished_total", finish_reason="abort"), 1)
        self.assertEqual(value(s, "pagedserve_requests_finished_total", finish_reason="stop"), 0)
        self.assertEqual(value(s, "pagedserve_requests_finished_total", finish_reason="error"), 0)

    def test_histogram_counts(self):
        hs = self.check_histograms(self.samples)
        count = lambda name: hs[(name, frozenset())]["count"]  # noqa: E731
        produced = sum(1 for r in self.results.values() if r["final"]["usage"]["completion_tokens"] > 0)
        self.assertEqual(produced, 12)
        self.assertEqual(count("pagedserve_time_to_first_token_seconds"), produced)
        for name in ("pagedserve_request_e2e_latency_seconds", "pagedserve_request_queue_time_seconds",
                     "pagedserve_request_prefill_time_seconds", "pagedserve_request_decode_time_seconds",
                     "pagedserve_request_prompt_tokens", "pagedserve_request_generation_tokens"):
            self.assertEqual(count(name), 12, name)
        # One inter-token gap per token after a sequence's first.
        gaps = sum(max(t - 1, 0) for r in self.results.values() for t in r["tokens"])
        self.assertEqual(count("pagedserve_inter_token_latency_seconds"), gaps)
        steps = count("pagedserve_step_tokens")
        self.assertGreater(steps, 0)
        self.assertEqual(hs[("pagedserve_rank_step_duration_seconds", frozenset({("rank", "0")}))]["count"], steps)

    def test_promtool_check_metrics_reports_nothing(self):
        self.assertIsNotNone(shutil.which("promtool"), "promtool not found: Debian package prometheus (scripts/install-deps)")
        text = self.server.scrape()
        r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
        # Exit 3: lint findings only. The only findings allowed are the two about
        # vLLM's own names (docs/metrics.md, "vLLM names"): ':' in every vllm:*
        # name and vllm:iteration_tokens_total, a histogram, ending in _total.
        self.assertIn(r.returncode, (0, 3), r.stdout + r.stderr)
        unexpected = [line for line in (r.stdout + r.stderr).decode().splitlines() if line and not (
            line.startswith("vllm:") and (line.endswith(" metric names should not contain ':'") or line ==
                                          'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix'))]
        self.assertEqual(unexpected, [])

    def test_vllm_names_carry_the_same_figures(self):
        # vLLM's names (what a vLLM dashboard, KEDA scaler or endpoint picker reads)
        # report what the clients saw, on the real server.
        s = self.samples
        served = served_model_name()
        vllm = {k: v for k, v in s.items() if k[0].startswith("vllm:")}
        self.assertGreater(len(vllm), 250)
        for (name, labels), _ in vllm.items():
            d = dict(labels)
            self.assertEqual(d.get("model_name"), served, name)
            self.assertEqual(d.get("engine"), "0", name)
        v = lambda name, **labels: value(s, name, model_name=served, engine="0", **labels)  # noqa: E731
        completion = sum(r["final"]["usage"]["completion_tokens"] for r in self.results.values())
        prompt = sum(r["final"]["usage"]["prompt_tokens"] for r in self.results.values())
        self.assertEqual(v("vllm:generation_tokens_total"), completion)
        self.assertEqual(v("vllm:prompt_tokens_total"), prompt)
        self.assertEqual(v("vllm:request_generation_tokens_sum"), completion)
        self.assertEqual(v("vllm:request_prompt_tokens_sum"), prompt)
        # The longest sequence of each request: less than the sum for the n = 2 ones.
        longest = sum(max(r["tokens"]) for r in self.results.values())
        self.assertLess(longest, completion)
        self.assertEqual(v("vllm:request_max_num_generation_tokens_sum"), longest)
        self.assertEqual(v("vllm:request_success_total", finished_reason="length"), 11)
        self.assertEqual(v("vllm:request_success_total", finished_reason="abort"), 1)
        self.assertEqual(v("vllm:request_success_total", finished_reason="stop"), 0)
        for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                     "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                     "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds"):
            self.assertEqual(v(name + "_count"), 12, name)
        gaps = sum(max(t - 1, 0) for r in self.results.values() for t in r["tokens"])
        self.assertEqual(v("vllm:time_per_output_token_seconds_count"), gaps)
        self.assertEqual(v("vllm:inter_token_latency_seconds_count"), gaps)
        self.assertEqual(v("vllm:iteration_tokens_total_count"), value(s, "pagedserve_step_tokens_count"))
        for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_swapped",
                      "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"):
            self.assertEqual(v(gauge), 0, gauge)
        # vLLM's token buckets: 1, 2, 5, 10, ... up to --max-model-len (256 here).
        les = sorted(float(dict(k[1])["le"]) for k in vllm if k[0] == "vllm:request_prompt_tokens_bucket")
        self.assertEqual(les, [1, 2, 5, 10, 20, 50, 100, 200, float("inf")])

    def test_prometheus_scrapes_the_server(self):
        self.assertIsNotNone(shutil.which("prometheus"),
                             "prometheus not found: Debian package prometheus (scripts/install-deps)")
        expected = value(self.samples, "pagedserve_generation_tokens_total")
        tmp = tempfile.mkdtemp(prefix="pagedserve-serve-prometheus-")
        port = free_port()
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                    "scrape_configs:\n  - job_name: pagedserve\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{self.server.metrics_port}']\n")
        log = open(os.path.join(tmp, "prometheus.log"), "wb")
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp}/prometheus.yml",
                                 f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

        def query(promql):
            body = json.loads(http_get(port, "/api/v1/query?query=" + urllib.parse.quote(promql)))
            self.assertEqual(body["status"], "success", body)
            return body["data"]["result"]

        def scraped():
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {proc.returncode}:\n{open(log.name).read()}")
            try:
                r = query("pagedserve_generation_tokens_total")
            except OSError as e:  # not listening yet
                return str(e)
            return True if r else r

        try:
            wait_for(scraped, 30, "no pagedserve series in Prometheus")
            r = query('pagedserve_generation_tokens_total{job="pagedserve"}')
            self.assertEqual(len(r), 1, r)
            self.assertEqual(r[0]["metric"]["instance"], f"127.0.0.1:{self.server.metrics_port}")
            self.assertEqual(float(r[0]["value"][1]), expected)
            r = query('sum by (finish_reason) (pagedserve_requests_finished_total{finish_reason=~"length|abort"})')
            self.assertEqual({x["metric"]["finish_reason"]: float(x["value"][1]) for x in r},
                             {"length": 11.0, "abort": 1.0})
            r = query("pagedserve_time_to_first_token_seconds_count")
            self.assertEqual([float(x["value"][1]) for x in r], [12.0])
            r = query(f'up{{job="pagedserve",instance="127.0.0.1:{self.server.metrics_port}"}}')
            self.assertEqual([float(x["value"][1]) for x in r], [1.0])
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()
            shutil.rmtree(tmp, ignore_errors=True)


class PreemptionTest(ServerTestCase):
    # 10 blocks of 16 tokens, one sequence needs up to 8 (128 tokens): four
    # concurrent requests must preempt each other; recompute frees the victim's
    # blocks, which stay in the prefix cache until reused.
    SERVER_FLAGS = ("--max-model-len=128", "--block-size=16", "--max-num-blocks=10", "--enable-prefix-caching",
                    "--preemption-mode=recompute", "--swap-space=0.0625")
    MAX_TOKENS = 80

    @classmethod
    def play(cls):
        prompts = distinct_prompts(4, seed=11, min_len=33, max_len=40)
        cls.requests = {f"p{i}": {"prompt_token_ids": p, "max_tokens": cls.MAX_TOKENS, "ignore_eos": True,
                                  "temperature": 0} for i, p in enumerate(prompts)}
        cls.results = run_workload(cls.server, cls.requests)
        wait_for(lambda: drained_gauges(cls.server), DRAIN_TIMEOUT, "gauges not back to 0 after the drain")
        cls.text = cls.server.scrape()
        cls.samples = parse_metrics(cls.text)

    def test_recomputed_requests_report_no_prefix_hits(self):
        s = self.samples
        self.assertGreater(value(s, "pagedserve_preemptions_total", mode="recompute"), 0)
        prompt = sum(r["final"]["usage"]["prompt_tokens"] for r in self.results.values())
        completion = sum(r["final"]["usage"]["completion_tokens"] for r in self.results.values())
        self.assertEqual(completion, 4 * self.MAX_TOKENS)
        self.assertEqual(value(s, "pagedserve_generation_tokens_total"), completion)
        # Recomputation prefills prompt + output again.
        self.assertGreater(value(s, "pagedserve_prompt_tokens_total"), prompt)
        # Lookups are counted at a request's first admission only.
        self.assertEqual(value(s, "pagedserve_prefix_cache_queries_tokens_total"), prompt)
        self.assertEqual(value(s, "pagedserve_prefix_cache_hits_tokens_total"), 0)
        for r in self.results.values():
            self.assertEqual(r["final"]["usage"].get("cached_prompt_tokens", 0), 0)
            self.assertEqual(r["final"]["outputs"][0]["finish_reason"], "length")
        self.assertEqual(value(s, "pagedserve_requests_finished_total", finish_reason="length"), 4)
        self.assertNotIn("pagedserve_metrics_rejected_observations_total", self.text)

    def test_histograms_after_preemption(self):
        hs = self.check_histograms(self.samples)
        self.assertEqual(hs[("pagedserve_time_to_first_token_seconds", frozenset())]["count"], 4)
        self.assertEqual(hs[("pagedserve_inter_token_latency_seconds", frozenset())]["count"],
                         4 * (self.MAX_TOKENS - 1))


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagedserve", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("-k", action="append", default=[], help="only tests matching this pattern")
    ARGS, rest = p.parse_known_args()
    argv = [sys.argv[0], "-v"] + [a for k in ARGS.k for a in ("-k", k)] + rest
    unittest.main(argv=argv)


if __name__ == "__main__":
    main()
