#!/usr/bin/env python3
"""Serving benchmark (issues 6, 12): pagedserve and llama.cpp's C++ llama-server
driven through the same OpenAI HTTP API (streaming POST /v1/completions), on
the same GGUF with the same number of threads, at a sweep of concurrency levels
and with Poisson arrivals; reports output tokens/s, TTFT, TPOT, ITL (mean, p50,
p99) per level in one table with ratios, and everything as JSON.

    bench/serving_bench.py [--backends pagedserve,llamacpp] [--model GGUF]
        [--concurrency 1,8,32,64] [--rounds 2] [--min-prompts 8]
        [--poisson-rate 0.5] [--poisson-prompts 32] [--poisson-max-concurrency 64]
        [--input-len 128] [--output-len 64] [--range-ratio 0.0]
        [--dataset random|shared-prefix|specdec] [--prefix-len 256] [--seed 0]
        [--repeats 2] [--threads 2] [--omp-wait-policy default|passive|active]
        [--json-out FILE]
        [--pagedserve-bin PATH] [--serve-arg=--max-num-batched-tokens=256 ...]
        [--llamacpp-server-bin PATH] [--llamacpp-arg=... ...]
        [--pagedserve-url http://HOST:PORT] [--llamacpp-url http://HOST:PORT]

Servers. By default the script starts each server itself, waits until it
answers (--startup-timeout), sends one untimed warm-up request, runs every
level, and stops the server (SIGTERM, then SIGKILL after 10 s; always, also on
errors and Ctrl-C). With --pagedserve-url / --llamacpp-url it attaches to a
running server instead and leaves it alone. Server output goes to --log-dir
(a temporary directory by default, printed).
  * pagedserve: `pagedserve serve --model GGUF --host 127.0.0.1 --port P
    --zmq-endpoint tcp://127.0.0.1:Q` with OMP_NUM_THREADS = OPENBLAS_NUM_THREADS
    = --threads (its engine defaults unless --serve-arg says otherwise).
  * Both servers run OpenMP (llama.cpp's default build uses GGML_OPENMP), and
    both get the same OMP_WAIT_POLICY: --omp-wait-policy default leaves it
    unset (libgomp's default: a waiting thread spins ~3 ms, then sleeps; what
    a deployment gets, and llama.cpp's own default), passive sets PASSIVE
    (sleep at once: use it on a shared, oversubscribed machine, where spinning
    threads slow every process down), active sets ACTIVE.
  * llama.cpp: `llama-server -m GGUF -t T -tb T --parallel S --cont-batching
    -c S*L --host 127.0.0.1 --port P` (default binary: bench/build-llamacpp's,
    ~/.cache/pagedserve/llamacpp/build/bin/llama-server), S = the largest level
    (and --poisson-max-concurrency), L = per-sequence length = the longest
    prompt + output of the workload + 16, rounded up to 256. llama-server splits
    -c evenly over its slots, so every slot holds a whole sequence. The script
    checks what the server reports (GET /props: total_slots, per-slot n_ctx) and
    records it; a slot context shorter than L is an error.
Continuous batching is checked, not assumed: during every level a sampler
polls the server (llama-server: GET /slots, the slots with is_processing;
pagedserve: GET /metrics, pagedserve_requests_running) every 0.25 s and
records the most requests it saw in progress at once ("max_running" in the
JSON and the table). At 32 concurrent requests it should be near 32 on both.

Runs. --repeats R runs each backend R times, interleaved (A B A B ...), each
run a fresh server and the whole sweep; the 1/5/15-minute load average is
recorded before each backend's run and before each level, and each server's
peak resident set (VmHWM of its process, "peak_rss_kb") when its run ends. The table pools the
repeats: throughputs are the mean over the repeats (each repeat's value in the
JSON), latency percentiles over all requests of all repeats.

Workload (identical for every backend and repeat: same seed, same prompts, same
arrival times): level C sends max(--rounds x C, --min-prompts) requests with at
most C in flight (a new one starts when one finishes); the Poisson run sends
--poisson-prompts requests at exponential gaps of mean 1/--poisson-rate s
(seeded) with at most --poisson-max-concurrency in flight (0 = no cap; skip the
run with --poisson-rate 0).
  * random: each request's prompt length is drawn uniformly from
    [input_len * (1 - range_ratio), input_len * (1 + range_ratio)] tokens and its
    output length likewise from output_len (vLLM's "random" dataset).
  * shared-prefix: every prompt starts with the same --prefix-len tokens
    followed by a random part drawn as above.
  * specdec: the committed input-grounded prompts of bench/specdec_prompts.json
    (speculative decoding, issue 33), in order, cycled, each sent as one user
    message to streaming POST /v1/chat/completions (the model's own chat
    template on both servers; text from `delta.content`), output length
    --output-len; --input-len only sizes llama-server's slots (set it to the
    longest templated prompt, ~200 tokens on the default file).
  Prompt text is made of random common English words trimmed to the exact
  token count with the model's tokenizer (llama.cpp's, through llama-cpp-python's
  vocab-only loading). Every request is the same JSON on both servers:
  {"prompt", "max_tokens": output length, "temperature": 0, "ignore_eos": true,
  "stream": true, "stream_options": {"include_usage": true}} — greedy, and
  exactly its output length: a request counts as completed only when the
  final usage says completion_tokens == its output length and finish_reason
  is "length" (both servers honour ignore_eos).

Metrics (as vLLM's benchmark_serving defines them):
  TTFT  time from sending a request to its first streamed token;
  TPOT  per request, (latency - TTFT) / (output tokens - 1);
  ITL   every gap between two consecutive streamed chunks that carry text (a
        chunk that carries several tokens, e.g. held-back text, is one gap);
  E2E   latency from send to the last message;
  output tokens/s = all output tokens / wall time of the level (first send to
  last reply).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import platform
import random
import re
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
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LLAMA_SERVER = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                    "pagedserve", "llamacpp", "build", "bin", "llama-server")

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
    """Makes prompt texts of an exact token length for the model's tokenizer:
    llama.cpp's, through llama-cpp-python's vocab-only loading when it is
    installed, else through POST /tokenize of a llama-server on the same GGUF
    (started for this and stopped again; or the one at --llamacpp-url)."""

    def __init__(self, gguf: str, llama_server_bin: str, llamacpp_url: Optional[str], log_dir: str):
        self.server = None
        try:
            import ctypes
            import llama_cpp as L
        except ImportError:
            L = None
        if L is not None:
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
            self.source = "llama-cpp-python (vocab only)"
            return
        self.L = None
        url = llamacpp_url
        if not url:
            if not os.access(llama_server_bin, os.X_OK):
                raise SystemExit("serving_bench: no tokenizer: install llama-cpp-python or build llama-server "
                                 "(bench/build-llamacpp)")
            port = free_port()
            self.server = Server("tokenizer", [llama_server_bin, "-m", gguf, "-t", "1", "-c", "512", "--parallel", "1",
                                               "--host", "127.0.0.1", "--port", str(port)], dict(os.environ), log_dir)
            url = f"http://127.0.0.1:{port}"
            self.server.wait_healthy(OpenAIBackend("llamacpp", url, 10.0), 120.0)
        u = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30.0)
        self.source = f"llama-server POST /tokenize ({url})"

    def close(self) -> None:
        if self.server:
            self.server.stop()
            self.server = None

    def tokenize(self, text: str) -> List[int]:
        if self.L is None:
            self.conn.request("POST", "/tokenize", json.dumps({"content": text, "add_special": False}),
                              {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"POST /tokenize: HTTP {resp.status}: {body[:200]!r}")
            return list(json.loads(body)["tokens"])
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
    chat: bool = False  # prompt is one user message for /v1/chat/completions


def uniform_len(rng: random.Random, mean: int, ratio: float) -> int:
    lo = max(1, int(mean * (1 - ratio)))
    hi = max(lo, int(mean * (1 + ratio)))
    return rng.randint(lo, hi)


def make_workload(args, maker: PromptMaker, num_prompts: int, request_rate: float, seed: int) -> List[Request]:
    rng = random.Random(seed)
    prefix = ""
    if args.dataset == "shared-prefix":
        prefix = maker.text(random.Random(args.seed), args.prefix_len - 1) + "."
    reqs = []
    t = 0.0
    if args.dataset == "specdec":
        texts = [p["prompt"] for p in json.load(open(os.path.join(ROOT, "bench", "specdec_prompts.json")))["prompts"]]
        for i in range(num_prompts):
            if request_rate != math.inf and i > 0:
                t += rng.expovariate(request_rate)
            text = texts[i % len(texts)]
            reqs.append(Request(i, text, len(maker.tokenize(text)), args.output_len, t, chat=True))
        return reqs
    for i in range(num_prompts):
        in_len = uniform_len(rng, args.input_len, args.range_ratio)
        out_len = uniform_len(rng, args.output_len, args.range_ratio)
        text = maker.text(rng, in_len, prefix)
        if request_rate != math.inf and i > 0:
            t += rng.expovariate(request_rate)
        reqs.append(Request(i, text, len(maker.tokenize(text)), out_len, t))
    return reqs


# ---------------------------------------------------------------------------
# The one client: streaming POST /v1/completions, the same body for both servers.


@dataclass
class Record:
    ok: bool = False
    error: str = ""
    send: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    chunk_times: List[float] = field(default_factory=list)  # absolute, per chunk with text
    output_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str = ""


class OpenAIBackend:
    """An OpenAI-compatible server at `url` (pagedserve or llama-server)."""

    def __init__(self, name: str, url: str, timeout: float, extra_body: Optional[dict] = None):
        u = urllib.parse.urlparse(url)
        self.name = name
        self.url = url
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout = timeout
        self.extra_body = extra_body or {}

    def get(self, path: str, timeout: float = 2.0) -> Tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def health(self) -> bool:
        try:
            return self.get("/health")[0] == 200
        except OSError:
            return False

    def running(self) -> Optional[int]:
        """Requests in progress right now, as the server reports them (None: unknown)."""
        try:
            if self.name == "llamacpp":
                status, body = self.get("/slots")
                if status != 200:
                    return None
                return sum(1 for s in json.loads(body) if s.get("is_processing"))
            status, body = self.get("/metrics")
            if status != 200:
                return None
            m = re.search(rb"^pagedserve_requests_running(?:\{[^}]*\})? ([0-9.e+]+)$", body, re.M)
            return int(float(m.group(1))) if m else None
        except (OSError, ValueError):
            return None

    def send(self, req: Request, rec: Record) -> None:
        prompt = {"messages": [{"role": "user", "content": req.prompt}]} if req.chat else {"prompt": req.prompt}
        body = json.dumps({**prompt, "max_tokens": req.output_len, "temperature": 0.0,
                           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                           **self.extra_body})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            rec.send = time.perf_counter()
            path = "/v1/chat/completions" if req.chat else "/v1/completions"
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {resp.read(300)!r}"
                return
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
                if "error" in msg:
                    rec.error = f"stream error: {msg['error']}"
                    return
                for choice in msg.get("choices") or []:
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if not rec.chunk_times:
                            rec.ttft = now - rec.send
                        rec.chunk_times.append(now)
                    if choice.get("finish_reason"):
                        rec.finish_reason = choice["finish_reason"]
                if msg.get("usage"):
                    rec.output_tokens = int(msg["usage"].get("completion_tokens", 0))
                    rec.prompt_tokens = int(msg["usage"].get("prompt_tokens", 0))
            rec.latency = time.perf_counter() - rec.send
            rec.ok = (rec.finish_reason == "length" and rec.output_tokens == req.output_len
                      and bool(rec.chunk_times))
            if not rec.ok:
                rec.error = (f"finish_reason {rec.finish_reason!r}, completion_tokens {rec.output_tokens} "
                             f"(wanted {req.output_len}), {len(rec.chunk_times)} chunks")
        finally:
            conn.close()


class RunningSampler:
    """Polls backend.running() on a thread; max_seen = the most in progress at once."""

    def __init__(self, backend: OpenAIBackend, interval: float = 0.25):
        self.backend, self.interval = backend, interval
        self.max_seen: Optional[int] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            n = self.backend.running()
            if n is not None:
                self.max_seen = n if self.max_seen is None else max(self.max_seen, n)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------------
# Servers started by the script


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

    def peak_rss_kb(self) -> Optional[int]:
        """The server process's peak resident set (VmHWM, kB) so far; None if gone."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return None

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


def thread_env(threads: int, wait_policy: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    if wait_policy != "default":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_pagedserve_bin() -> str:
    for d in ("build-bench", "build"):
        p = os.path.join(ROOT, d, "runtime", "cli", "pagedserve")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("pagedserve") or os.path.join(ROOT, "build", "runtime", "cli", "pagedserve")


def start_pagedserve(args, log_dir: str, tag: str):
    port = free_port()
    cmd = [args.pagedserve_bin, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--zmq-endpoint", f"tcp://127.0.0.1:{free_port()}", "--disable-log-requests"] + args.serve_arg
    return Server(f"pagedserve{tag}", cmd, thread_env(args.threads, args.omp_wait_policy), log_dir), f"http://127.0.0.1:{port}"


def start_llamacpp(args, log_dir: str, tag: str):
    port = free_port()
    cmd = [args.llamacpp_server_bin, "-m", args.model, "-t", str(args.threads), "-tb", str(args.threads),
           "--host", "127.0.0.1", "--port", str(port), "--parallel", str(args.llamacpp_parallel),
           "--cont-batching", "-c", str(args.llamacpp_parallel * args.seq_len)] + args.llamacpp_arg
    return Server(f"llamacpp{tag}", cmd, thread_env(args.threads, args.omp_wait_policy), log_dir), f"http://127.0.0.1:{port}"


def check_llamacpp(backend: OpenAIBackend, args) -> Dict:
    """What llama-server says about its slots; an error when a slot cannot hold a sequence."""
    status, body = backend.get("/props", timeout=10.0)
    if status != 200:
        raise SystemExit(f"serving_bench: llama-server GET /props: HTTP {status}")
    props = json.loads(body)
    slot_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    info = {"total_slots": props.get("total_slots"), "slot_n_ctx": slot_ctx,
            "build_info": props.get("build_info")}
    if slot_ctx is not None and slot_ctx < args.seq_len:
        raise SystemExit(f"serving_bench: llama-server slots hold {slot_ctx} tokens, the workload needs "
                         f"{args.seq_len}; raise -c (see --llamacpp-arg)")
    if info["total_slots"] is not None and info["total_slots"] < args.llamacpp_parallel:
        raise SystemExit(f"serving_bench: llama-server has {info['total_slots']} slots, wanted "
                         f"{args.llamacpp_parallel}")
    return info


# ---------------------------------------------------------------------------
# Running and reporting


def run_workload(backend, reqs: List[Request], max_concurrency: int, run_timeout: float) -> Tuple[List[Record], float]:
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


def latency_stats(records: List[Record]) -> Dict:
    done = [r for r in records if r.ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itl = [b - a for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    return {"ttft_ms": stats_ms([r.ttft for r in done]), "tpot_ms": stats_ms(tpot), "itl_ms": stats_ms(itl),
            "e2e_latency_ms": stats_ms([r.latency for r in done])}


def summarize(records: List[Record], duration: float) -> Dict:
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    return {
        "completed": len(done), "failed": len(records) - len(done),
        "errors": sorted({r.error for r in records if not r.ok})[:5],
        "duration_s": round(duration, 3),
        "request_throughput_per_s": round(len(done) / duration, 4) if duration > 0 else 0.0,
        "output_tokens_per_s": round(out_tokens / duration, 2) if duration > 0 else 0.0,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        **latency_stats(records),
    }


def fmt_stat(s: Dict[str, float]) -> str:
    return " / ".join(f"{s[k]:.1f}" for k in ("mean", "p50", "p99"))


def print_table(report: Dict, names: List[str]) -> None:
    """One table: per level, each backend's pooled figures and the ratio pagedserve / llama.cpp."""
    two = len(names) == 2
    head = ["level", "metric"] + names + (["ratio"] if two else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    for level, by_name in report["levels"].items():
        pooled = {n: by_name[n]["pooled"] for n in names if n in by_name}
        if len(pooled) != len(names):
            continue
        rows = [("output tokens/s", lambda p: p["output_tokens_per_s_mean"],
                 lambda p: " / ".join(f"{x:.1f}" for x in p["output_tokens_per_s_runs"]), True)]
        for m, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
            rows.append((f"{label} mean / p50 / p99 (ms)", lambda p, m=m: p[m]["p50"],
                         lambda p, m=m: fmt_stat(p[m]), False))
        rows.append(("completed / failed; max running", None,
                     lambda p: f"{p['completed']} / {p['failed']}; {p['max_running']}", False))
        for label, key, cell, higher_better in rows:
            line = [level, label] + [cell(pooled[n]) for n in names]
            if two:
                a, b = (key(pooled[n]) if key else None for n in names)
                if a is None or b is None or not b or a != a or b != b:
                    line.append("")
                elif higher_better:
                    line.append(f"{a / b:.2f}x")
                else:
                    line.append(f"{a / b:.2f}x (p50)")
            print("| " + " | ".join(line) + " |")
    for level, by_name in report["levels"].items():
        for n in names:
            if n in by_name and by_name[n]["pooled"]["errors"]:
                print(f"{level} {n} errors: {by_name[n]['pooled']['errors']}")


def pool(runs: List[Dict], records: List[Record]) -> Dict:
    thr = [r["output_tokens_per_s"] for r in runs]
    running = [r["max_running"] for r in runs if r.get("max_running") is not None]
    return {"output_tokens_per_s_mean": round(statistics.fmean(thr), 2), "output_tokens_per_s_runs": thr,
            "completed": sum(r["completed"] for r in runs), "failed": sum(r["failed"] for r in runs),
            "errors": sorted({e for r in runs for e in r["errors"]})[:5],
            "max_running": max(running) if running else None, **latency_stats(records)}


def default_model() -> str:
    return subprocess.check_output([os.path.join(ROOT, "scripts", "fetch-model")], text=True).strip()


def loadavg() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--backends", default="pagedserve,llamacpp")
    ap.add_argument("--model", help="GGUF file (default: scripts/fetch-model)")
    ap.add_argument("--concurrency", default="1,8,32,64", help="comma-separated levels (requests in flight)")
    ap.add_argument("--rounds", type=int, default=2, help="level C sends max(rounds x C, --min-prompts) requests")
    ap.add_argument("--min-prompts", type=int, default=8)
    ap.add_argument("--poisson-rate", type=float, default=0.5, help="requests/s of the Poisson run (0 = no run)")
    ap.add_argument("--poisson-prompts", type=int, default=32)
    ap.add_argument("--poisson-max-concurrency", type=int, default=64, help="0 = no cap")
    ap.add_argument("--dataset", choices=("random", "shared-prefix", "specdec"), default="random")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--range-ratio", type=float, default=0.0)
    ap.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens of the common prefix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="runs per backend, interleaved (A B A B ...)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    ap.add_argument("--omp-wait-policy", choices=["default", "passive", "active"], default="default",
                    help="OMP_WAIT_POLICY of both servers (default: unset, libgomp's spin-then-sleep)")
    ap.add_argument("--extra-body", help="JSON object merged into every request (e.g. a response_format "
                    "whose language is longer than --output-len, so that every request still ends by length)")
    ap.add_argument("--json-out")
    ap.add_argument("--log-dir")
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds without a reply before a request fails")
    ap.add_argument("--run-timeout", type=float, default=1800.0, help="seconds for one level of one run")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--pagedserve-bin", default=None)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for pagedserve serve (repeatable), e.g. --serve-arg=--max-num-seqs=64")
    ap.add_argument("--llamacpp-server-bin", default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--llamacpp-arg", action="append", default=[], help="extra argument for llama-server")
    ap.add_argument("--pagedserve-url", help="attach to this running pagedserve HTTP API instead of starting one")
    ap.add_argument("--llamacpp-url", help="attach to this running llama-server instead of starting one")
    args = ap.parse_args()
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in names:
        if b not in ("pagedserve", "llamacpp"):
            ap.error(f"--backends: unknown backend {b!r} (pagedserve, llamacpp)")
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        ap.error("--concurrency: comma-separated integers")
    if any(c < 1 for c in levels) or args.rounds < 1 or args.repeats < 1:
        ap.error("--concurrency levels, --rounds and --repeats must be >= 1")
    if args.input_len < 1 or args.output_len < 1 or not 0 <= args.range_ratio < 1:
        ap.error("--input-len, --output-len must be >= 1 and --range-ratio in [0, 1)")
    if args.poisson_rate < 0:
        ap.error("--poisson-rate must be >= 0 (0 = no Poisson run)")
    args.model = args.model or default_model()
    args.pagedserve_bin = args.pagedserve_bin or default_pagedserve_bin()
    if "llamacpp" in names and not args.llamacpp_url and not os.access(args.llamacpp_server_bin, os.X_OK):
        ap.error(f"no llama-server at {args.llamacpp_server_bin} (bench/build-llamacpp builds it)")
    longest = (int(args.input_len * (1 + args.range_ratio)) + int(args.output_len * (1 + args.range_ratio))
               + (args.prefix_len if args.dataset == "shared-prefix" else 0) + 16)
    args.seq_len = -(-longest // 256) * 256
    args.llamacpp_parallel = max(levels + ([args.poisson_max_concurrency or args.poisson_prompts]
                                           if args.poisson_rate > 0 else []))
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="serving_bench.")
    os.makedirs(log_dir, exist_ok=True)

    def on_signal(signum, frame):
        Server.stop_all()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    maker = PromptMaker(args.model, args.llamacpp_server_bin, args.llamacpp_url, log_dir)
    try:
        # The workloads: (level name, requests, max in flight), the same for every backend and repeat.
        workloads = []
        for c in levels:
            n = max(args.rounds * c, args.min_prompts)
            workloads.append((f"c={c}", make_workload(args, maker, n, math.inf, args.seed + c), c))
        if args.poisson_rate > 0:
            workloads.append((f"poisson {args.poisson_rate:g}/s",
                              make_workload(args, maker, args.poisson_prompts, args.poisson_rate, args.seed + 1000),
                              args.poisson_max_concurrency))
    finally:
        maker.close()
    warm = Request(-1, "Warm-up request: say something about lighthouses.", 0, 8, 0.0)
    report = {
        "workload": {k: (v if v != math.inf else "inf") for k, v in vars(args).items()
                     if k in ("concurrency", "rounds", "min_prompts", "poisson_rate", "poisson_prompts",
                              "poisson_max_concurrency", "dataset", "input_len", "output_len", "range_ratio",
                              "prefix_len", "seed", "repeats", "seq_len")},
        "requests_per_level": {name: len(reqs) for name, reqs, _ in workloads},
        "model": os.path.basename(args.model), "threads_per_server": args.threads,
        "omp_wait_policy": args.omp_wait_policy,
        "tokenizer": maker.source, "host": {"cpu_count": os.cpu_count(), "machine": platform.machine()},
        "runs": [],
    }
    records: Dict[Tuple[str, str], List[Record]] = {}
    try:
        for rep in range(args.repeats):
            for name in names:
                tag = f".{rep + 1}" if args.repeats > 1 else ""
                run = {"backend": name, "repeat": rep + 1, "load_average_before": loadavg(), "levels": {}}
                server = None
                url = args.pagedserve_url if name == "pagedserve" else args.llamacpp_url
                if not url:
                    server, url = (start_pagedserve if name == "pagedserve" else start_llamacpp)(args, log_dir, tag)
                backend = OpenAIBackend(name, url, args.request_timeout,
                                        json.loads(args.extra_body) if args.extra_body else None)
                run.update(url=url, command=server and " ".join(server.proc.args))
                try:
                    if server:
                        server.wait_healthy(backend, args.startup_timeout)
                    elif not backend.health():
                        raise SystemExit(f"serving_bench: {name} at {url} does not answer")
                    if name == "llamacpp":
                        run["llamacpp"] = check_llamacpp(backend, args)
                    if not args.no_warmup:
                        rec = Record()
                        warm.output_len = 8
                        backend.send(warm, rec)
                        if not rec.ok:
                            raise SystemExit(f"serving_bench: {name} warm-up request failed: {rec.error}")
                    for level, reqs, cap in workloads:
                        print(f"serving_bench: {name} run {rep + 1}: {level}, {len(reqs)} requests "
                              f"(load {os.getloadavg()[0]:.1f})...", file=sys.stderr)
                        load = loadavg()
                        with RunningSampler(backend) as sampler:
                            recs, duration = run_workload(backend, reqs, cap, args.run_timeout)
                        s = summarize(recs, duration)
                        s.update(load_average_before=load, max_running=sampler.max_seen)
                        run["levels"][level] = s
                        records.setdefault((level, name), []).extend(recs)
                finally:
                    if server:
                        run["peak_rss_kb"] = server.peak_rss_kb()
                        server.stop()
                report["runs"].append(run)
    finally:
        Server.stop_all()

    report["levels"] = {}
    for level, _, cap in workloads:
        report["levels"][level] = {}
        for name in names:
            runs = [r["levels"][level] for r in report["runs"] if r["backend"] == name and level in r["levels"]]
            if runs:
                report["levels"][level][name] = {"pooled": pool(runs, records[(level, name)])}
    goals = {}
    if names == ["pagedserve", "llamacpp"]:
        for level in ("c=32", "c=64"):
            lv = report["levels"].get(level)
            if not lv or len(lv) < 2:
                continue
            p, l = lv["pagedserve"]["pooled"], lv["llamacpp"]["pooled"]
            goals[level] = {
                "output_tokens_per_s_ratio": round(p["output_tokens_per_s_mean"] / l["output_tokens_per_s_mean"], 3)
                if l["output_tokens_per_s_mean"] else None,
                "ttft_p50_ratio": round(p["ttft_ms"]["p50"] / l["ttft_ms"]["p50"], 3) if l["ttft_ms"]["p50"] else None,
                "tpot_p50_ratio": round(p["tpot_ms"]["p50"] / l["tpot_ms"]["p50"], 3) if l["tpot_ms"]["p50"] else None,
            }
            g = goals[level]
            g["met"] = bool(g["output_tokens_per_s_ratio"] and g["output_tokens_per_s_ratio"] >= 1.5
                            and g["ttft_p50_ratio"] is not None and g["ttft_p50_ratio"] <= 1.0
                            and g["tpot_p50_ratio"] is not None and g["tpot_p50_ratio"] <= 1.2)
        report["goals"] = goals

    w = report["workload"]
    print(f"\nworkload: input {w['input_len']} output {w['output_len']} tokens (range ratio {w['range_ratio']}), "
          f"dataset {w['dataset']}, levels {report['requests_per_level']} (requests), {args.repeats} run(s) "
          f"per backend interleaved, {args.threads} threads per server (OMP_WAIT_POLICY "
          f"{args.omp_wait_policy}), model {report['model']}")
    for r in report["runs"]:
        print(f"{r['backend']} run {r['repeat']}: load average before {r['load_average_before']}"
              + (f"; peak RSS {r['peak_rss_kb'] / 1024:.0f} MiB" if r.get("peak_rss_kb") else "")
              + (f"; llama-server {r['llamacpp']}" if r.get("llamacpp") else ""))
    print_table(report, names)
    for level, g in goals.items():
        print(f"goal at {level} (>= 1.5x output tokens/s, TTFT p50 <= 1x, TPOT p50 <= 1.2x): "
              f"{g['output_tokens_per_s_ratio']}x, {g['ttft_p50_ratio']}x, {g['tpot_p50_ratio']}x -> "
              f"{'met' if g['met'] else 'not met'}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"serving_bench: wrote {args.json_out}", file=sys.stderr)
    failed = sum(r["failed"] for run in report["runs"] for r in run["levels"].values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
