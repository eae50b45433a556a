#!/usr/bin/env python3
"""Open HTTP connections against a real `pagedserve serve`: threads, RSS, TTFT.

    bench/http_connections.py --pagedserve build/runtime/cli/pagedserve --model M \
        [--connections 1000,10000] [--rounds 2] [--ttft-samples 10]

For each connection count N: the server's thread count and RSS (/proc/PID/status)
before and with N open connections, and the time to first token of a fresh
streaming chat request (time to the first SSE event that carries content) on the
idle server and with the N connections open, alternating, `--rounds` times.

The open connections stand in for idle keep-alive clients: each has sent the start
of a request ("GET /health HTTP/1.1\\r\\nHost: x\\r\\n", no blank line) and then
nothing, so the server holds its parser and buffers under the request deadline
(--http-timeout, set long here). Truly idle keep-alive connections are closed by
the server after 5 s, which is shorter than opening 10,000 takes; a stalled request
costs the server at least what an idle connection does.
Raises its own descriptor limit to the hard one; the server raises its own.
"""

import argparse
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def status_field(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, model):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--port", "0", f"--zmq-endpoint=tcp://127.0.0.1:{free_port()}",
             "--max-model-len=512", "--kv-cache-memory=134217728", "--http-timeout=600",
             "--disable-log-requests"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        self.port = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited: " + self.logs())
            m = re.search(r"HTTP API on http://[0-9.]+:(\d+)", self.logs())
            if m:
                self.port = int(m.group(1))
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError("the server never became healthy: " + self.logs())

    def logs(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def threads(self):
        return status_field(self.proc.pid, "Threads")

    def rss_kib(self):
        return status_field(self.proc.pid, "VmRSS")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def ttft(port):
    """Seconds from sending a streaming chat request to its first content event."""
    body = json.dumps({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4,
                       "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    start = time.perf_counter()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    first = None
    while first is None:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("stream ended without content: " + got.decode(errors="replace"))
        got += chunk
        for m in re.finditer(rb"data: (\{.*?\})\n\n", got):
            choices = json.loads(m.group(1)).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.perf_counter() - start
                break
    while s.recv(65536):
        pass
    s.close()
    return first


def open_connections(port, n):
    conns = []
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        conns.append(c)
    return conns


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagedserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--connections", default="1000,10000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttft-samples", type=int, default=10)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"descriptor limit {hard}; load average {os.getloadavg()}", flush=True)
    server = Server(args.pagedserve, args.model)
    try:
        for _ in range(2):
            ttft(server.port)  # warm-up
        for n in [int(x) for x in args.connections.split(",")]:
            if n + 64 > hard:
                print(f"N={n}: skipped (descriptor limit {hard})")
                continue
            idle_ttft, loaded_ttft = [], []
            for r in range(args.rounds):
                print(f"N={n} round {r + 1}: load average {os.getloadavg()}", flush=True)
                idle_ttft += [ttft(server.port) for _ in range(args.ttft_samples)]
                threads0, rss0 = server.threads(), server.rss_kib()
                t0 = time.perf_counter()
                conns = open_connections(server.port, n)
                opened = time.perf_counter() - t0
                time.sleep(1.0)  # the server has accepted and read every one
                threads1, rss1 = server.threads(), server.rss_kib()
                loaded_ttft += [ttft(server.port) for _ in range(args.ttft_samples)]
                health = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=60).status
                print(f"  opened {n} in {opened:.2f} s; threads {threads0} -> {threads1}; RSS "
                      f"{rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB ({(rss1 - rss0) * 1024 / n / 1000:.2f} KB "
                      f"per connection); /health {health}", flush=True)
                for c in conns:
                    c.close()
                time.sleep(1.0)
            print(f"N={n}: TTFT idle median {statistics.median(idle_ttft) * 1000:.1f} ms p99 "
                  f"{p(idle_ttft, 0.99) * 1000:.1f} ms; with {n} open median "
                  f"{statistics.median(loaded_ttft) * 1000:.1f} ms p99 {p(loaded_ttft, 0.99) * 1000:.1f} ms "
                  f"({len(idle_ttft)} samples each)", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
