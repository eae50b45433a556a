#!/usr/bin/env python3
"""Serving benchmark (issue 6): one workload against pagedserve (protocol v1 over
ZeroMQ, streaming) and against llama.cpp's own server (llama-cpp-python's
OpenAI-compatible server, streaming /v1/completions), on the same GGUF, one
after the other in one run; reports request throughput, output tokens/s, TTFT,
TPOT, ITL and end-to-end latency (mean, p50, p99) as text and JSON.

    bench/serving_bench.py [--backends pagedserve,llamacpp] [--model GGUF]
        [--num-prompts 32] [--request-rate inf | R] [--max-concurrency C]
        [--dataset random|shared-prefix] [--input-len 128] [--output-len 64]
        [--range-ratio 0.0] [--prefix-len 256] [--seed 0] [--json-out FILE]
        [--pagedserve-bin PATH] [--serve-arg=--max-num-seqs=64 ...]
        [--pagedserve-endpoint tcp://HOST:PORT] [--llamacpp-url http://HOST:PORT]

Servers: by default the script starts each server itself (pagedserve serve
with --threads' worth of OpenMP/OpenBLAS threads; python3 -m llama_cpp.server
with --n_threads/--n_threads_batch), waits until it answers (--startup-timeout),
sends one untimed warm-up request, runs the workload, and stops the server
(SIGTERM, then SIGKILL after 10 s; always, also on errors and Ctrl-C). With
--pagedserve-endpoint / --llamacpp-url it attaches to a running server instead
and leaves it alone. Server output goes to --log-dir (a temporary directory by
default, printed).

Workload (identical for every backend: same seed, same prompts, same arrival
times):
  * random: each request's prompt length is drawn uniformly from
    [input_len * (1 - range_ratio), input_len * (1 + range_ratio)] tokens and its
    output length likewise from output_len (vLLM's "random" dataset).
  * shared-prefix: every prompt starts with the same --prefix-len tokens
    (a system-prompt style workload) followed by a random part drawn as above.
  Prompt text is made of random common English words and trimmed to the exact
  token count with the model's tokenizer (llama.cpp's, through llama-cpp-python's
  vocab-only loading). Every request is greedy (temperature 0) and generates
  exactly its output length: pagedserve with ignore_eos, llama.cpp with a -100
  logit bias on every end-of-generation token and max_tokens.
  Arrivals: all at once (--request-rate inf) or a Poisson process of rate R
  requests/s (exponential gaps, seeded); --max-concurrency caps requests in
  flight (the others wait for a free slot).

Metrics (as vLLM's benchmark_serving defines them):
  TTFT  time from sending a request to its first streamed token;
  TPOT  per request, (latency - TTFT) / (output tokens - 1);
  ITL   every gap between two consecutive streamed chunks (a chunk that carries
        several tokens, e.g. held-back text, is one gap);
  E2E   latency from send to the last message;
  output tokens/s = all output tokens / wall time of the run (first send to last
  reply); request throughput = completed requests / that time.
Output tokens per request: pagedserve's usage.completion_tokens; llama.cpp's
max_tokens when finish_reason is "length" (streamed chunks do not carry usage),
else the number of chunks.

Caveat (recorded in the JSON): llama-cpp-python's server runs one request at a
time (a lock around its single llama context; no continuous batching), so under
concurrency its requests queue. llama.cpp's C++ llama-server (--parallel N,
continuous batching) is a stronger baseline; it is used when --llamacpp-server-bin
names one (started as `BIN -m GGUF -t T --parallel C --cont-batching --port P`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

WORDS = ("time person year way day thing man world life hand part child eye woman place "
         "work week case point government company number group problem fact be have do say "
         "get make go know take see come think look want give use find tell ask seem feel try "
         "leave call good new first last long great little own other old right big high "
         "different small large next early young important few public bad same able river "
         "mountain harbour lighthouse garden window kitchen letter market station engine "
         "paper music winter summer morning evening story history question answer system "
         "water light stone bridge village forest island ocean road city country family").split()


# ---------------------------------------------------------------------------
# Workload


class PromptMaker:
    """Makes prompt texts of an exact token length for the model's tokenizer."""

    def __init__(self, gguf: str):
        import ctypes
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        self._quiet = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._quiet, ctypes.c_void_p())
        p = L.llama_model_default_params()
        p.vocab_only = True
        self.model = L.llama_model_load_from_file(gguf.encode(), p)
        if not self.model:
            raise SystemExit(f"serving_bench: cannot load the tokenizer of {gguf}")
        self.vocab = L.llama_model_get_vocab(self.model)
        n = L.llama_vocab_n_tokens(self.vocab)
        self.eog_ids = [i for i in range(n) if L.llama_vocab_is_eog(self.vocab, i)]

    def tokenize(self, text: str) -> List[int]:
        raw = text.encode()
        buf = (self.L.llama_token * (len(raw) + 16))()
        n = self.L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, False)
        if n < 0:
            raise RuntimeError("llama_tokenize failed")
        return list(buf[:n])

    def text(self, rng: random.Random, num_tokens: int, prefix: str = "") -> str:
        """A text whose tokenization (after `prefix`) has exactly num_tokens more tokens."""
        base = len(self.tokenize(prefix)) if prefix else 0
        words: List[str] = []

        def join() -> str:
            return prefix + (" " if prefix else "") + " ".join(words)

        def count() -> int:
            return len(self.tokenize(join())) - base

        n = count()
        while n != num_tokens:
            if n > num_tokens:
                words.pop()  # only random words overshoot: " a" is always one token
            elif num_tokens - n > 3:
                words.extend(rng.choice(WORDS) for _ in range(max(1, (num_tokens - n) // 2)))
            else:
                words.append("a")
            n = count()
        return join()


@dataclass
class Request:
    index: int
    prompt: str
    prompt_len: int
    output_len: int
    arrival: float  # seconds after the start of the run


def uniform_len(rng: random.Random, mean: int, ratio: float) -> int:
    lo = max(1, int(mean * (1 - ratio)))
    hi = max(lo, int(mean * (1 + ratio)))
    return rng.randint(lo, hi)


def make_workload(args, maker: PromptMaker) -> List[Request]:
    rng = random.Random(args.seed)
    prefix = ""
    if args.dataset == "shared-prefix":
        prefix = maker.text(rng, args.prefix_len - 1) + "."
    reqs = []
    t = 0.0
    for i in range(args.num_prompts):
        in_len = uniform_len(rng, args.input_len, args.range_ratio)
        out_len = uniform_len(rng, args.output_len, args.range_ratio)
        text = maker.text(rng, in_len, prefix)
        if args.request_rate != math.inf and i > 0:
            t += rng.expovariate(args.request_rate)
        reqs.append(Request(i, text, len(maker.tokenize(text)), out_len, t))
    return reqs


# ---------------------------------------------------------------------------
# Backends: each send() runs one streamed request and returns its record.


@dataclass
class Record:
    ok: bool = False
    error: str = ""
    send: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    chunk_times: List[float] = field(default_factory=list)  # absolute, per chunk with tokens
    output_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str = ""


class PagedServeBackend:
    name = "pagedserve"

    def __init__(self, endpoint: str, timeout: float):
        import zmq
        self.endpoint = endpoint
        self.timeout = timeout
        self.context = zmq.Context()

    def health(self) -> bool:
        from pagedserve_client import Client
        try:
            with Client(self.endpoint, timeout=1.0, context=self.context) as c:
                return c.health()
        except Exception:
            return False

    def send(self, req: Request, rec: Record) -> None:
        from pagedserve_client import Client
        with Client(self.endpoint, timeout=self.timeout, context=self.context) as c:
            rec.send = time.perf_counter()
            stream = c.stream(req.prompt, max_tokens=req.output_len, temperature=0.0, ignore_eos=True)
            for delta in stream:
                if delta.token_ids:
                    now = time.perf_counter()
                    if not rec.chunk_times:
                        rec.ttft = now - rec.send
                    rec.chunk_times.append(now)
            rec.latency = time.perf_counter() - rec.send
            final = stream.final
            rec.output_tokens = int(final.usage.get("completion_tokens", 0))
            rec.prompt_tokens = int(final.usage.get("prompt_tokens", 0))
            rec.finish_reason = final.outputs[0].finish_reason if final.outputs else ""
            rec.ok = rec.finish_reason == "length" and bool(rec.chunk_times)
            if not rec.ok:
                rec.error = f"finish_reason {rec.finish_reason!r}, {len(rec.chunk_times)} chunks"

    def close(self) -> None:
        self.context.term()


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, url: str, timeout: float, eog_ids: List[int]):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout = timeout
        self.logit_bias = {str(i): -100.0 for i in eog_ids}

    def health(self) -> bool:
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
            conn.request("GET", "/v1/models")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def send(self, req: Request, rec: Record) -> None:
        body = json.dumps({"prompt": req.prompt, "max_tokens": req.output_len, "temperature": 0.0,
                           "stream": True, "logit_bias": self.logit_bias})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            rec.send = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {resp.read(300)!r}"
                return
            chunks = 0
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                msg = json.loads(data)
                choice = (msg.get("choices") or [{}])[0]
                if choice.get("text"):
                    now = time.perf_counter()
                    if not rec.chunk_times:
                        rec.ttft = now - rec.send
                    rec.chunk_times.append(now)
                    chunks += 1
                if choice.get("finish_reason"):
                    rec.finish_reason = choice["finish_reason"]
                if msg.get("usage"):
                    rec.output_tokens = msg["usage"].get("completion_tokens", 0)
            rec.latency = time.perf_counter() - rec.send
            if not rec.output_tokens:
                rec.output_tokens = req.output_len if rec.finish_reason == "length" else chunks
            rec.prompt_tokens = req.prompt_len
            rec.ok = rec.finish_reason == "length" and bool(rec.chunk_times)
            if not rec.ok:
                rec.error = f"finish_reason {rec.finish_reason!r}, {chunks} chunks"
        finally:
            conn.close()

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------
# Servers started by the script


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process in its own process group, always stopped by stop()."""

    live: List["Server"] = []

    def __init__(self, name: str, cmd: List[str], env: Dict[str, str], log_dir: str):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.log = open(self.log_path, "wb")
        print(f"serving_bench: starting {name}: {' '.join(cmd)} (log {self.log_path})", file=sys.stderr)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=ROOT)
        Server.live.append(self)

    def wait_healthy(self, backend, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"serving_bench: {self.name} exited with {self.proc.returncode} "
                                 f"during startup; see {self.log_path}:\n{self.tail()}")
            if backend.health():
                return
            time.sleep(0.5)
        raise SystemExit(f"serving_bench: {self.name} not healthy after {timeout:g} s; "
                         f"see {self.log_path}:\n{self.tail()}")

    def tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self in Server.live:
            Server.live.remove(self)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.log.close()

    @classmethod
    def stop_all(cls) -> None:
        for s in list(cls.live):
            s.stop()


def thread_env(threads: int) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    return env


def default_pagedserve_bin() -> str:
    for d in ("build-bench", "build"):
        p = os.path.join(ROOT, d, "runtime", "cli", "pagedserve")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("pagedserve") or os.path.join(ROOT, "build", "runtime", "cli", "pagedserve")


def start_pagedserve(args, log_dir: str):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    cmd = [args.pagedserve_bin, "serve", "--model", args.model, "--zmq-endpoint", endpoint] + args.serve_arg
    server = Server("pagedserve", cmd, thread_env(args.threads), log_dir)
    return server, endpoint


def start_llamacpp(args, log_dir: str):
    port = free_port()
    if args.llamacpp_server_bin:
        cmd = [args.llamacpp_server_bin, "-m", args.model, "-t", str(args.threads), "--port", str(port),
               "--host", "127.0.0.1", "--parallel", str(args.llamacpp_parallel), "--cont-batching",
               "-c", str(args.llamacpp_n_ctx * args.llamacpp_parallel)]
    else:
        cmd = [sys.executable, os.path.join(ROOT, "bench", "llamacpp_server.py"), "--model", args.model, "--host", "127.0.0.1",
               "--port", str(port), "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
               "--n_ctx", str(args.llamacpp_n_ctx), "--interrupt_requests", "False"]
    cmd += args.llamacpp_arg
    server = Server("llamacpp", cmd, thread_env(args.threads), log_dir)
    return server, f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------
# Running and reporting


def run_workload(backend, reqs: List[Request], max_concurrency: int, run_timeout: float) -> (List[Record], float):
    records = [Record() for _ in reqs]
    slots = threading.Semaphore(max_concurrency) if max_concurrency > 0 else None
    start = time.perf_counter()

    def one(req: Request, rec: Record) -> None:
        delay = start + req.arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if slots:
            slots.acquire()
        try:
            backend.send(req, rec)
        except Exception as e:  # a failed request is counted, not fatal
            rec.error = f"{type(e).__name__}: {e}"
            rec.latency = time.perf_counter() - rec.send if rec.send else 0.0
        finally:
            if slots:
                slots.release()

    threads = [threading.Thread(target=one, args=(r, rec), daemon=True) for r, rec in zip(reqs, records)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + run_timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for rec in records:
        if not rec.ok and not rec.error:
            rec.error = f"not finished within --run-timeout {run_timeout:g} s"
    end = max([rec.send + rec.latency for rec in records if rec.ok] or [time.perf_counter()])
    return records, end - start


def stats_ms(values: List[float]) -> Dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    v = sorted(x * 1000.0 for x in values)

    def pct(p):  # linear interpolation, as numpy.percentile's default
        k = (len(v) - 1) * p / 100.0
        f = math.floor(k)
        c = min(f + 1, len(v) - 1)
        return v[f] + (v[c] - v[f]) * (k - f)

    return {"mean": round(statistics.fmean(v), 3), "p50": round(pct(50), 3), "p99": round(pct(99), 3)}


def summarize(records: List[Record], duration: float) -> Dict:
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itl = [b - a for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    errors = sorted({r.error for r in records if not r.ok})
    return {
        "completed": len(done), "failed": len(records) - len(done), "errors": errors[:5],
        "duration_s": round(duration, 3),
        "request_throughput_per_s": round(len(done) / duration, 4) if duration > 0 else 0.0,
        "output_tokens_per_s": round(out_tokens / duration, 2) if duration > 0 else 0.0,
        "total_tokens_per_s": round((in_tokens + out_tokens) / duration, 2) if duration > 0 else 0.0,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "ttft_ms": stats_ms([r.ttft for r in done]), "tpot_ms": stats_ms(tpot),
        "itl_ms": stats_ms(itl), "e2e_latency_ms": stats_ms([r.latency for r in done]),
    }


def print_table(results: Dict[str, Dict]) -> None:
    names = list(results)
    rows = [("completed / failed", lambda s: f"{s['completed']} / {s['failed']}"),
            ("duration (s)", lambda s: f"{s['duration_s']:.2f}"),
            ("request throughput (req/s)", lambda s: f"{s['request_throughput_per_s']:.3f}"),
            ("output tokens/s", lambda s: f"{s['output_tokens_per_s']:.1f}"),
            ("total tokens/s", lambda s: f"{s['total_tokens_per_s']:.1f}")]
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        for k in ("mean", "p50", "p99"):
            rows.append((f"{m[:-3].upper()} {k} (ms)", lambda s, m=m, k=k: f"{s[m][k]:.1f}"))
    width = 28
    print(f"{'':{width}}" + "".join(f"{n:>14}" for n in names)
          + (f"{'ratio':>10}" if len(names) == 2 else ""))
    for label, fmt in rows:
        cells = [fmt(results[n]["summary"]) for n in names]
        line = f"{label:{width}}" + "".join(f"{c:>14}" for c in cells)
        if len(names) == 2 and label in ("output tokens/s", "request throughput (req/s)", "total tokens/s"):
            key = {"output tokens/s": "output_tokens_per_s", "request throughput (req/s)": "request_throughput_per_s",
                   "total tokens/s": "total_tokens_per_s"}[label]
            a, b = (results[n]["summary"][key] for n in names)
            line += f"{(a / b if b else float('nan')):>9.2f}x"
        print(line)
    for n in names:
        if results[n]["summary"]["errors"]:
            print(f"{n} errors: {results[n]['summary']['errors']}")


def default_model() -> str:
    return subprocess.check_output([os.path.join(ROOT, "scripts", "fetch-model")], text=True).strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--backends", default="pagedserve,llamacpp")
    ap.add_argument("--model", help="GGUF file (default: scripts/fetch-model)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson); inf = all at once")
    ap.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most (0 = no cap)")
    ap.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--range-ratio", type=float, default=0.0)
    ap.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens of the common prefix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    ap.add_argument("--json-out")
    ap.add_argument("--log-dir")
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds without a reply before a request fails")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds for the whole workload per backend")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--pagedserve-bin", default=None)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for pagedserve serve (repeatable), e.g. --serve-arg=--max-num-seqs=64")
    ap.add_argument("--pagedserve-endpoint", help="attach to this running pagedserve instead of starting one")
    ap.add_argument("--llamacpp-url", help="attach to this running llama.cpp server instead of starting one")
    ap.add_argument("--llamacpp-server-bin", help="llama.cpp's llama-server binary (default: llama-cpp-python's server)")
    ap.add_argument("--llamacpp-parallel", type=int, default=32, help="llama-server --parallel (slots)")
    ap.add_argument("--llamacpp-n-ctx", type=int, default=2048, help="context per sequence of the llama.cpp server")
    ap.add_argument("--llamacpp-arg", action="append", default=[], help="extra argument for the llama.cpp server")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in ("pagedserve", "llamacpp"):
            ap.error(f"--backends: unknown backend {b!r} (pagedserve, llamacpp)")
    if args.num_prompts < 1 or args.input_len < 1 or args.output_len < 1 or not 0 <= args.range_ratio < 1:
        ap.error("--num-prompts, --input-len, --output-len must be >= 1 and --range-ratio in [0, 1)")
    if args.request_rate <= 0:
        ap.error("--request-rate must be > 0 (inf = all at once)")
    args.model = args.model or default_model()
    args.pagedserve_bin = args.pagedserve_bin or default_pagedserve_bin()
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="serving_bench.")
    os.makedirs(log_dir, exist_ok=True)

    def on_signal(signum, frame):
        Server.stop_all()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    maker = PromptMaker(args.model)
    reqs = make_workload(args, maker)
    warm = Request(-1, "Warm-up request: say something about lighthouses.", 0, 8, 0.0)
    report = {
        "workload": {k: (v if v != math.inf else "inf") for k, v in vars(args).items()
                     if k in ("num_prompts", "request_rate", "max_concurrency", "dataset", "input_len", "output_len",
                              "range_ratio", "prefix_len", "seed")},
        "model": os.path.basename(args.model), "threads_per_server": args.threads,
        "host": {"cpu_count": os.cpu_count(), "machine": platform.machine()},
        "backends": {},
    }
    try:
        for name in backends:
            server = None
            load_before = os.getloadavg()
            if name == "pagedserve":
                endpoint = args.pagedserve_endpoint
                if not endpoint:
                    server, endpoint = start_pagedserve(args, log_dir)
                backend = PagedServeBackend(endpoint, args.request_timeout)
                info = {"endpoint": endpoint, "command": server and " ".join(server.proc.args)}
            else:
                url = args.llamacpp_url
                if not url:
                    server, url = start_llamacpp(args, log_dir)
                backend = LlamaCppBackend(url, args.request_timeout, maker.eog_ids)
                info = {"url": url, "command": server and " ".join(server.proc.args),
                        "note": None if args.llamacpp_server_bin or args.llamacpp_url else
                        "llama-cpp-python server: one request at a time (no continuous batching)"}
            try:
                if server:
                    server.wait_healthy(backend, args.startup_timeout)
                else:
                    if not backend.health():
                        raise SystemExit(f"serving_bench: {name} at {info.get('endpoint') or info.get('url')} "
                                         "does not answer")
                if not args.no_warmup:
                    rec = Record()
                    backend.send(warm, rec)
                    if not rec.ok:
                        raise SystemExit(f"serving_bench: {name} warm-up request failed: {rec.error}")
                print(f"serving_bench: {name}: {len(reqs)} requests...", file=sys.stderr)
                load_before = os.getloadavg()
                records, duration = run_workload(backend, reqs, args.max_concurrency, args.run_timeout)
                load_after = os.getloadavg()
            finally:
                backend.close()
                if server:
                    server.stop()
            summary = summarize(records, duration)
            report["backends"][name] = {
                **info, "summary": summary,
                "load_average_before_after": [[round(x, 2) for x in load_before], [round(x, 2) for x in load_after]],
            }
    finally:
        Server.stop_all()

    w = report["workload"]
    print(f"\nworkload: {w['num_prompts']} requests, rate {w['request_rate']}, dataset {w['dataset']}, "
          f"input {w['input_len']} output {w['output_len']} tokens (range ratio {w['range_ratio']}), "
          f"{args.threads} threads per server, model {report['model']}")
    for n, r in report["backends"].items():
        print(f"{n}: load average (1/5/15 min) before {r['load_average_before_after'][0]}, "
              f"after {r['load_average_before_after'][1]}")
    print_table(report["backends"])
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"serving_bench: wrote {args.json_out}", file=sys.stderr)
    return 0 if all(r["summary"]["failed"] == 0 for r in report["backends"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
