#!/usr/bin/env python3
"""Soak run of a real `pagedserve serve` (issue 36, "Soak").

    scripts/soak [MINUTES] [--rate R] [--model PATH] [--pagedserve BIN] [--tp N]
                 [--kill-worker] [--sample-interval S] [--json OUT]

Poisson arrivals (--rate requests/s) through HTTP (OpenAI API) and ZeroMQ
(protocol v1), mixing: streamed and non-streamed completions, chat, n = 2,
beam search, aborts (ZeroMQ abort after the first delta), disconnects (an SSE
client that closes after the first event), and prompts that share long
prefixes (prefix cache hits). The KV pool is small (--max-num-blocks), so
sequences are preempted. With --tp 2 --kill-worker (mpirun) a worker rank is
killed (SIGKILL) half-way: the job must exit within the documented time (the
orchestrator restarts it, docs/distributed.md), the requests in flight must
end with an error, never hang; the soak then starts the server again and goes on.

Every --sample-interval seconds it records the server's RSS, open fds and
threads (/proc of the coordinator), KV usage, running/waiting requests and the
HTTP response counts by status (/metrics). Each server life is judged at two
idle points, after warm-up and at the end (load paused, in-flight requests
done):
  * RSS and open fds at the end within 5% of the warm-up idle point (fds: or
    +2, a 5% of ~40 fds is not a whole fd);
  * KV usage 0 and no running or waiting request at each idle point;
  * no error but the intended ones (aborts, disconnects, the killed worker's
    requests), every response well-formed (JSON, SSE framing, usage and
    finish_reason present, n choices for n = 2), no HTTP 5xx once the server
    is ready (its /health answers 503 "loading" before).
Exit 0 on pass, 1 on failure (the reasons printed), 2 on bad usage. The samples
and the verdict go to --json. CI runs it for 2 minutes (tests/soak/CMakeLists.txt).
"""

import argparse
import collections
import concurrent.futures
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
import pagedserve_client  # noqa: E402

FINISH_REASONS = {"stop", "length"}
WORDS = ("paged attention keeps the cache in blocks the scheduler hands out one step at a time "
         "while the workers only move bytes and the coordinator decides where each token lives").split()


# What a read of the server's HTTP pages may meet while the server is busy or
# starting: a refused or reset connection, a timeout (OSError: URLError,
# socket.timeout, ConnectionResetError), a truncated response or status line
# (http.client.HTTPException: IncompleteRead, RemoteDisconnected's siblings) or
# a page that does not parse (ValueError). Every read treats them alike: it is
# retried (or, for a periodic sample, that sample goes without the page).
TRANSIENT = (OSError, ValueError, http.client.HTTPException)
# How long a new server's first /metrics read is retried.
METRICS_READ_TIMEOUT = 60.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Failures:
    """Thread-safe record of what went wrong (unexpected) and what was intended."""

    def __init__(self):
        self.lock = threading.Lock()
        self.unexpected = []
        self.counts = collections.Counter()

    def count(self, what):
        with self.lock:
            self.counts[what] += 1

    def fail(self, kind, detail):
        with self.lock:
            self.counts["unexpected"] += 1
            if len(self.unexpected) < 50:
                self.unexpected.append(f"{kind}: {detail}"[:500])


class Server:
    """One life of `pagedserve serve` (under mpirun with --tp > 1)."""

    def __init__(self, args):
        self.args = args
        self.port = free_port()
        self.zmq = f"tcp://127.0.0.1:{free_port()}"
        self.pid_file = tempfile.mktemp(prefix="pagedserve-soak-", suffix=".pid")
        self.log = tempfile.TemporaryFile()
        cmd = [args.pagedserve, "serve", args.model, f"--port={self.port}", f"--zmq-endpoint={self.zmq}",
               f"--max-model-len={args.max_model_len}", f"--max-num-blocks={args.max_num_blocks}",
               "--max-num-seqs=16", "--swap-space=0.0625", f"--pid-file={self.pid_file}",
               "--disable-log-requests", "--disable-log-stats"]
        env = dict(os.environ)
        if args.tp > 1:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1")
            cmd = ["mpirun", "-np", str(1 + args.tp), "--oversubscribe"] + cmd + [f"--tensor-parallel-size={args.tp}"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env,
                                     start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            self.pid = self.wait_ready()
            # The readiness polls above get 503 "loading" until the model is in
            # (intended, and counted by the server): 5xx are judged from here on.
            self.ready_5xx = metric_sum(self.read_metrics(), "pagedserve_http_responses_total", 'status="5')
        except BaseException:
            self.stop()  # a server that never became ready is not left running
            raise

    def logs(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def wait_ready(self, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} at start:\n{self.logs()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200 and os.path.exists(self.pid_file):
                        return int(open(self.pid_file).read())
            except TRANSIENT:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy within {timeout} s")

    def read_metrics(self, timeout=None):
        """The /metrics page, retried as wait_ready retries /health while a read fails
        transiently (TRANSIENT); RuntimeError when the server exits or `timeout` (default
        METRICS_READ_TIMEOUT) passes without one good read."""
        timeout = METRICS_READ_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                return metrics(self.url)
            except TRANSIENT as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"/metrics not readable within {timeout} s: "
                                       f"{type(e).__name__}: {e}") from e
            time.sleep(0.2)

    def worker_pids(self):
        """pids of the worker ranks: pagedserve processes of the job but the coordinator."""
        out = subprocess.run(["pgrep", "-s", str(self.proc.pid), "-f", "pagedserve serve"],
                             capture_output=True, text=True).stdout.split()
        return [int(p) for p in out if int(p) not in (self.pid, self.proc.pid)]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.unlink(self.pid_file)
        except OSError:
            pass


def proc_sample(pid):
    """(RSS bytes, open fds, threads) of a process, or None when it is gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, fds, int(fields["Threads"])


def metrics(url):
    """{name{labels}: value} of the /metrics page."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metric_sum(m, name, label_filter=""):
    return sum(v for k, v in m.items() if (k == name or k.startswith(name + "{")) and label_filter in k)


def snapshot(server):
    sample = {"t": time.time()}
    p = proc_sample(server.pid)
    if p is not None:
        sample.update(rss=p[0], fds=p[1], threads=p[2])
    try:
        m = metrics(server.url)
    except TRANSIENT:
        return sample
    sample.update(kv=metric_sum(m, "pagedserve_kv_cache_usage_ratio", 'pool="device"'),
                  running=metric_sum(m, "pagedserve_requests_running"),
                  waiting=metric_sum(m, "pagedserve_requests_waiting"),
                  preemptions=metric_sum(m, "pagedserve_preemptions_total"),
                  http_5xx=metric_sum(m, "pagedserve_http_responses_total", 'status="5'))
    return sample


# --- the load -----------------------------------------------------------------

class Load:
    """Request kinds, each checking its response; run by a thread pool."""

    def __init__(self, args, failures):
        self.args = args
        self.failures = failures
        self.rng = random.Random(args.seed)
        self.rng_lock = threading.Lock()
        self.prefixes = [" ".join(self.pick_words(120)) for _ in range(4)]
        # Requests in flight are bounded by the client threads: an arrival that
        # finds them all busy is shed (counted), so the server's queue stays
        # bounded and a slow machine cannot turn the soak into a pile-up.
        self.slots = threading.BoundedSemaphore(args.concurrency)
        self.kinds = [(self.http_stream, 3), (self.http_chat, 2), (self.http_n2, 1), (self.http_beam, 1),
                      (self.http_disconnect, 1), (self.zmq_stream, 2), (self.zmq_abort, 1)]

    def pick_words(self, n):
        return [self.rng.choice(WORDS) for _ in range(n)]

    def prompt(self):
        with self.rng_lock:
            shared = self.rng.random() < 0.5
            head = self.rng.choice(self.prefixes) if shared else ""
            return (head + " " + " ".join(self.pick_words(self.rng.randint(3, 40)))).strip()

    def choose(self):
        with self.rng_lock:
            return self.rng.choices([k for k, _ in self.kinds], weights=[w for _, w in self.kinds])[0]

    def max_tokens(self):
        with self.rng_lock:
            return self.rng.randint(4, 48)

    # HTTP
    def post(self, server, path, body, timeout=300):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def check_choices(self, kind, status, raw, n, chat=False):
        if status >= 500 or status != 200:
            raise AssertionError(f"{kind}: HTTP {status}: {raw[:300]!r}")
        body = json.loads(raw)
        choices = body["choices"]
        if len(choices) != n or sorted(c["index"] for c in choices) != list(range(n)):
            raise AssertionError(f"{kind}: {len(choices)} choices, wanted {n}: {body}")
        for c in choices:
            if c["finish_reason"] not in FINISH_REASONS:
                raise AssertionError(f"{kind}: finish_reason {c['finish_reason']!r}")
            text = c["message"]["content"] if chat else c["text"]
            if not isinstance(text, str):
                raise AssertionError(f"{kind}: no text in {c}")
        u = body["usage"]
        if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"] or u["completion_tokens"] <= 0:
            raise AssertionError(f"{kind}: usage {u}")

    def http_chat(self, server):
        status, raw = self.post(server, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": self.prompt()}],
                                 "max_tokens": self.max_tokens(), "temperature": 0.8})
        self.check_choices("chat", status, raw, 1, chat=True)

    def http_n2(self, server):
        status, raw = self.post(server, "/v1/completions",
                                {"prompt": self.prompt(), "n": 2, "max_tokens": self.max_tokens(), "temperature": 1.0})
        self.check_choices("n2", status, raw, 2)

    def http_beam(self, server):
        status, raw = self.post(server, "/v1/completions",
                                {"prompt": self.prompt(), "n": 2, "use_beam_search": True, "temperature": 0,
                                 "max_tokens": self.max_tokens()})
        self.check_choices("beam", status, raw, 2)

    def sse_events(self, server, body, stop_after=None):
        """Parsed SSE events of a streamed completion; stop_after: close after that many."""
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        events = []
        try:
            conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                raise AssertionError(f"stream: HTTP {r.status}: {r.read()[:300]!r}")
            buf = b""
            while True:
                line = r.readline()
                if not line:
                    raise AssertionError(f"stream: connection ended without [DONE] after {len(events)} events")
                if line in (b"\r\n", b"\n"):
                    if not buf.startswith(b"data: "):
                        raise AssertionError(f"stream: malformed event {buf[:200]!r}")
                    data = buf[6:].strip()
                    buf = b""
                    if data == b"[DONE]":
                        return events
                    events.append(json.loads(data))
                    if stop_after is not None and len(events) >= stop_after:
                        return events
                else:
                    buf += line
        finally:
            conn.close()  # for stop_after: a client that goes away mid-stream

    def http_stream(self, server):
        events = self.sse_events(server, {"prompt": self.prompt(), "max_tokens": self.max_tokens(),
                                          "temperature": 0.7, "stream_options": {"include_usage": True}})
        finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
        if finishes not in ([r] for r in FINISH_REASONS) or "usage" not in events[-1]:
            raise AssertionError(f"stream: finish reasons {finishes}, last event {events[-1] if events else None}")

    def http_disconnect(self, server):
        self.sse_events(server, {"prompt": self.prompt(), "max_tokens": 200, "ignore_eos": True}, stop_after=1)
        self.failures.count("intended_disconnects")

    # ZeroMQ
    def zmq_stream(self, server):
        with pagedserve_client.Client(server.zmq, timeout=300) as c:
            s = c.stream(self.prompt(), max_tokens=self.max_tokens(), temperature=0.7)
            for _ in s:
                pass
            f = s.final
            if f.error or [o.finish_reason in FINISH_REASONS for o in f.outputs] != [True]:
                raise AssertionError(f"zmq stream: {f}")

    def zmq_abort(self, server):
        with pagedserve_client.Client(server.zmq, timeout=300) as c:
            s = c.stream(self.prompt(), max_tokens=200, ignore_eos=True)
            for _ in s:
                s.abort()
                break
            for _ in s:
                pass
            reasons = [o.finish_reason for o in s.final.outputs]
            if reasons not in (["abort"], ["length"]):  # length: it finished before the abort came
                raise AssertionError(f"zmq abort: finish reasons {reasons}")
            self.failures.count("intended_aborts")

    def run_one(self, server, kind, killing):
        try:
            kind(server)
            self.failures.count("ok")
        except Exception as e:  # noqa: BLE001 - every failure is recorded, none ends the soak
            if killing.is_set() or server.proc.poll() is not None and self.args.kill_worker:
                self.failures.count("intended_worker_kill_errors")
            else:
                self.failures.fail(kind.__name__, f"{type(e).__name__}: {e}")
        finally:
            self.slots.release()


def load_phase(server, load, seconds, pool, killing, kill_at=None):
    """Poisson arrivals for `seconds`; returns when the requests it started are done."""
    futures = []
    end = time.monotonic() + seconds
    killed = False
    while time.monotonic() < end:
        time.sleep(load.rng.expovariate(load.args.rate))
        if kill_at is not None and not killed and time.monotonic() >= kill_at:
            return futures, True
        if server.proc.poll() is not None and not killing.is_set():
            load.failures.fail("server", f"exited with {server.proc.returncode}:\n{server.logs()[-2000:]}")
            return futures, False
        if not load.slots.acquire(blocking=False):
            load.failures.count("shed_arrivals")
            continue
        futures.append(pool.submit(load.run_one, server, load.choose(), killing))
    concurrent.futures.wait(futures, timeout=300)
    return futures, killed


def idle_point(server, failures, what, timeout=60):
    """Waits for no request in flight and KV usage 0; returns the sample."""
    deadline = time.monotonic() + timeout
    while True:
        s = snapshot(server)
        if s.get("kv") == 0 and s.get("running") == 0 and s.get("waiting") == 0:
            s["idle"] = what
            return s
        if time.monotonic() > deadline:
            failures.fail("idle", f"{what}: not idle within {timeout} s (KV usage {s.get('kv')}, running "
                          f"{s.get('running')}, waiting {s.get('waiting')}): KV blocks leaked?")
            s["idle"] = what
            return s
        time.sleep(0.5)


def judge_life(base, end, failures, life, ready_5xx):
    """RSS and fds at the end idle point against the warm-up idle point."""
    if "rss" not in base or "rss" not in end:
        failures.fail("process", f"life {life}: no /proc sample of the coordinator")
        return
    rss_growth = end["rss"] / base["rss"] - 1
    if rss_growth > 0.05:
        failures.fail("rss", f"life {life}: RSS grew {100 * rss_growth:.1f}% at idle "
                      f"({base['rss'] >> 20} -> {end['rss'] >> 20} MiB)")
    if end["fds"] > max(base["fds"] * 1.05, base["fds"] + 2):
        failures.fail("fds", f"life {life}: open fds {base['fds']} -> {end['fds']} at idle")
    after_ready = end.get("http_5xx", 0) - ready_5xx
    if after_ready > 0:
        failures.fail("http", f"life {life}: {after_ready:.0f} HTTP 5xx responses after the server was ready")


def sampler(get_server, samples, stop, interval):
    while not stop.wait(interval):
        server = get_server()
        if server is not None:
            samples.append(dict(snapshot(server), life=server.life))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("minutes", nargs="?", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (Poisson)")
    ap.add_argument("--model", default=None, help="default: scripts/fetch-model")
    ap.add_argument("--pagedserve", default=os.path.join(ROOT, "build", "runtime", "cli", "pagedserve"))
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (> 1: under mpirun)")
    ap.add_argument("--kill-worker", action="store_true", help="SIGKILL a worker rank half-way (needs --tp > 1)")
    ap.add_argument("--max-num-blocks", type=int, default=40, help="a small KV pool: preemption")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at most (client threads)")
    ap.add_argument("--sample-interval", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the samples and the verdict here")
    args = ap.parse_args()
    if args.kill_worker and args.tp < 2:
        ap.error("--kill-worker needs --tp 2 or more (a worker rank under mpirun)")
    if args.model is None:
        args.model = subprocess.run([os.path.join(ROOT, "scripts", "fetch-model")], capture_output=True,
                                    text=True, check=True).stdout.strip()
    total = args.minutes * 60
    warmup = min(120.0, max(20.0, 0.35 * total))
    failures = Failures()
    load = Load(args, failures)
    samples, idle = [], []
    stop = threading.Event()
    killing = threading.Event()
    current = {"server": None}
    started = time.monotonic()
    life = 0

    def start_server():
        nonlocal life
        life += 1
        s = Server(args)
        s.life = life
        current["server"] = s
        print(f"soak: life {life}: server up (pid {s.pid}), warm-up {warmup:.0f} s", flush=True)
        return s

    server = start_server()
    sampler_thread = threading.Thread(target=sampler, args=(lambda: current["server"], samples, stop,
                                                            args.sample_interval), daemon=True)
    sampler_thread.start()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency)
    kill_pending = args.kill_worker
    try:
        while True:
            # Every life gets a warm-up and some load, a life after a restart
            # at least 20 s of each even when the run's time is up.
            floor = 20.0 if life > 1 else 0.0
            left = max(total - (time.monotonic() - started), floor)
            load_phase(server, load, max(min(warmup, left), floor), pool, killing)
            base = idle_point(server, failures, f"life {life} after warm-up")
            idle.append(base)
            left = max(total - (time.monotonic() - started), floor)
            # The kill comes half-way through the first life's load after its
            # warm-up (at least 20 s of load, so that requests are in flight).
            kill_at = None
            if kill_pending:
                left = max(left, 40.0)
                kill_at = time.monotonic() + left / 2
            _, killed = load_phase(server, load, left, pool, killing, kill_at)
            if killed:
                kill_pending = False
                killed_at = time.monotonic()
                killing.set()
                victims = server.worker_pids()
                if not victims:
                    failures.fail("kill", "no worker rank found to kill")
                for pid in victims[:1]:
                    print(f"soak: life {life}: SIGKILL worker pid {pid}", flush=True)
                    os.kill(pid, signal.SIGKILL)
                try:
                    server.proc.wait(timeout=30)
                    print(f"soak: life {life}: job exited with {server.proc.returncode} "
                          f"{time.monotonic() - killed_at:.1f} s after the kill", flush=True)
                except subprocess.TimeoutExpired:
                    failures.fail("kill", "the job did not exit within 30 s of a worker's SIGKILL")
                pool.shutdown(wait=True)  # requests in flight end (with errors) rather than hang
                pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency)
                server.stop()
                killing.clear()
                server = start_server()
                continue
            end = idle_point(server, failures, f"life {life} at the end")
            idle.append(end)
            judge_life(base, end, failures, life, server.ready_5xx)
            break
    finally:
        stop.set()
        pool.shutdown(wait=True)
        server.stop()
        if server.proc.returncode not in (0, None) and not args.kill_worker:
            failures.fail("server", f"exit status {server.proc.returncode}:\n{server.logs()[-2000:]}")
    verdict = {"pass": not failures.unexpected, "failures": failures.unexpected, "counts": dict(failures.counts),
               "minutes": args.minutes, "rate": args.rate, "tp": args.tp, "kill_worker": args.kill_worker,
               "idle_points": idle, "samples": samples}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(verdict, f, indent=1)
    for p in idle:
        print(f"soak: {p['idle']}: RSS {p.get('rss', 0) >> 20} MiB, fds {p.get('fds')}, threads {p.get('threads')}, "
              f"KV {p.get('kv')}, preemptions {p.get('preemptions')}", flush=True)
    print(f"soak: counts {dict(failures.counts)}")
    if failures.unexpected:
        print("soak: FAIL\n  " + "\n  ".join(failures.unexpected))
        return 1
    print("soak: pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
