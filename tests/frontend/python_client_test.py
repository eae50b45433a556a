#!/usr/bin/env python3
"""The Python client (clients/python, package pagedserve_client).

    python_client_test.py
        client logic against an in-process fake ROUTER server (no engine): id
        matching with interleaved streams, error replies, output order,
        timeouts. The client is imported from the source tree.
    python_client_test.py --install [--pagedserve BIN --model DIR]
        builds the package (pyproject.toml) and pip-installs it, offline, into
        a fresh virtual environment, then reruns this script there: the client
        imported from that environment's site-packages (checked), the fake
        server tests, and with --pagedserve a real `pagedserve serve` on DIR:
        health, stats, greedy generate, the same request streamed, a bad value.

Exit code 77 (skipped) when pyzmq is missing.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import zmq
except ImportError:
    # Exit 77 = skipped (CTest SKIP_RETURN_CODE); 1 where PAGEDSERVE_ALLOWED_SKIPS
    # (scripts/test: the no-GPU reasons only) does not allow this reason.
    import re
    reason = "pyzmq missing (scripts/install-deps)"
    allowed = os.environ.get("PAGEDSERVE_ALLOWED_SKIPS")
    if allowed is not None and not re.search(allowed, reason):
        print("SKIP NOT ALLOWED (PAGEDSERVE_ALLOWED_SKIPS): " + reason)
        sys.exit(1)
    print("skipped: " + reason)
    sys.exit(77)

SOURCE_DIR = os.environ.get("PAGEDSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CLIENT_DIR = os.path.join(SOURCE_DIR, "clients", "python")


def install_and_rerun(args):
    """Builds and installs the package into a new venv; runs this script there."""
    with tempfile.TemporaryDirectory(prefix="pagedserve-client-") as tmp:
        src = os.path.join(tmp, "src")  # a copy: building writes build/ and *.egg-info
        shutil.copytree(CLIENT_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        venv = os.path.join(tmp, "venv")
        # System site-packages: pyzmq, setuptools and wheel come from there (no
        # network). No pip inside (ensurepip is slow, and absent without Debian's
        # python3-venv): this interpreter's pip installs into the venv (--python).
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                       check=True)
        python = os.path.join(venv, "bin", "python")
        r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index",
                            "--no-build-isolation", "--no-deps", "-q", src], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"pip install failed (setuptools and wheel come from scripts/install-deps):\n"
                  f"{r.stdout}{r.stderr}")
            return 1
        cmd = [python, os.path.abspath(__file__), "--installed-in", venv]
        if args.pagedserve:
            cmd += ["--pagedserve", os.path.abspath(args.pagedserve), "--model", os.path.abspath(args.model)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PAGEDSERVE_SOURCE_DIR")}
        return subprocess.run(cmd, env=env, cwd=tmp).returncode


def import_client(installed_in):
    if installed_in is None:
        sys.path.insert(0, CLIENT_DIR)
    import pagedserve_client
    if installed_in is not None:
        from importlib import metadata
        location = os.path.realpath(pagedserve_client.__file__)
        assert location.startswith(os.path.realpath(installed_in)), \
            f"pagedserve_client imported from {location}, not from the venv {installed_in}"
        dist = metadata.distribution("pagedserve-client")
        assert dist.version == pagedserve_client.__version__, (dist.version, pagedserve_client.__version__)
        assert any(r.startswith("pyzmq") for r in dist.requires or []), dist.requires
        assert any(str(f).endswith("pagedserve_client/py.typed") for f in dist.files), "py.typed missing"
        print(f"installed package: pagedserve-client {dist.version} at {location}")
    return pagedserve_client


def fake_server_test(pc):
    ctx = zmq.Context()
    srv = ctx.socket(zmq.ROUTER)
    port = srv.bind_to_random_port("tcp://127.0.0.1")

    def serve():
        pending = []
        while True:
            ident, raw = srv.recv_multipart()
            m = json.loads(raw)

            def send(d, ident=ident):
                srv.send_multipart([ident, json.dumps({"version": 1, **d}).encode()])
            t = m["type"]
            if t == "quit":
                return
            if t == "silent":
                continue
            if t == "health":
                send({"type": "health", "id": m["id"], "status": "ok"})
            elif t == "stats":
                send({"type": "stats", "id": m["id"], "num_waiting": 0})
            elif t == "generate":
                if m.get("top_p", 1) > 1:
                    send({"type": "error", "id": m["id"], "code": "invalid_request",
                          "message": "top_p must be in (0, 1], got 1.5"})
                    continue
                if m["stream"]:
                    pending.append((m, send))
                    if len(pending) == 2:  # interleave two streams
                        for i in range(2):
                            for pm, ps in pending:
                                ps({"type": "delta", "id": pm["id"], "outputs": [
                                    {"index": 0, "text": pm["id"][-1] + str(i), "token_ids": [i]}]})
                        for pm, ps in pending:
                            ps({"type": "final", "id": pm["id"], "stream": True,
                                "outputs": [{"index": 0, "finish_reason": "length"}],
                                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "cached_prompt_tokens": 0}})
                        pending.clear()
                else:
                    send({"type": "final", "id": m["id"], "stream": False, "outputs": [
                        {"index": 1, "finish_reason": "stop", "text": "b", "token_ids": [2]},
                        {"index": 0, "finish_reason": "length", "text": "a", "token_ids": [1]}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "cached_prompt_tokens": 0}})
    th = threading.Thread(target=serve, daemon=True)  # daemon: a failed assert must not hang
    th.start()
    with pc.Client(f"tcp://127.0.0.1:{port}", timeout=5) as c:
        assert c.health()
        assert c.stats() == {"num_waiting": 0}
        r = c.generate(messages=[{"role": "user", "content": "hi"}], n=2)
        assert [o.text for o in r.outputs] == ["a", "b"], r
        try:
            c.generate("x", top_p=1.5)
            assert False
        except pc.PagedServeError as e:
            assert e.code == "invalid_request" and "1.5" in e.message
        s1 = c.stream("p", request_id="A")
        s2 = c.stream("q", request_id="B")
        got2 = [d.text for d in s2]
        got1 = [d.text for d in s1]
        assert got1 == ["A0", "A1"] and got2 == ["B0", "B1"], (got1, got2)
        assert s1.final.outputs[0].finish_reason == "length" and s1.text() == "A0A1"
        c.timeout = 0.2
        c.send({"type": "silent", "id": "z"})
        try:
            c._next_reply("z")
            assert False
        except pc.PagedServeTimeout as e:
            assert e.code == "timeout"
        c.send({"type": "quit"})
    th.join()
    srv.close()
    ctx.term()
    print("fake server: OK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_server_test(pc, binary, model):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "serve", f"--model={model}", f"--zmq-endpoint={endpoint}",
                             "--max-model-len=256", "--kv-cache-memory=67108864", "--swap-space=0.0625", "--port=0"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        healthy = False
        while not healthy and time.monotonic() < deadline:
            assert proc.poll() is None, f"server exited with {proc.returncode}"
            try:
                with pc.Client(endpoint, timeout=1.0) as c:
                    healthy = c.health()
            except pc.PagedServeError:
                time.sleep(0.2)
        assert healthy, "server not healthy within 120 s"
        with pc.Client(endpoint, timeout=60) as c:
            stats = c.stats()
            assert isinstance(stats, dict) and stats, stats
            r = c.generate("The quick brown fox", max_tokens=5, temperature=0, ignore_eos=True)
            out = r.outputs[0]
            assert out.finish_reason == "length" and len(out.token_ids) == 5, r
            assert r.usage["completion_tokens"] == 5 and r.usage["prompt_tokens"] > 0, r.usage
            s = c.stream("The quick brown fox", max_tokens=5, temperature=0, ignore_eos=True)
            ids = [t for d in s for t in d.token_ids]
            assert ids == out.token_ids and s.text() == out.text, (ids, out.token_ids, s.text(), out.text)
            assert s.final.outputs[0].finish_reason == "length"
            try:
                c.generate("x", top_p=1.5)
                assert False, "top_p=1.5 accepted"
            except pc.PagedServeError as e:
                assert e.code == "invalid_request" and "top_p" in e.message, e
        print(f"real server: OK (greedy {out.token_ids}, {out.text!r})")
    except BaseException:
        log.seek(0)
        print("server log:\n" + log.read().decode("utf-8", "replace"))
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--install", action="store_true", help="pip-install the package into a venv first")
    ap.add_argument("--installed-in", help=argparse.SUPPRESS)  # set by --install for the rerun
    ap.add_argument("--pagedserve", help="the pagedserve binary: also test against a real server")
    ap.add_argument("--model", help="model for the real server (with --pagedserve)")
    args = ap.parse_args()
    if args.pagedserve and not args.model:
        ap.error("--pagedserve needs --model")
    if args.install:
        return install_and_rerun(args)
    pc = import_client(args.installed_in)
    fake_server_test(pc)
    if args.pagedserve:
        real_server_test(pc, args.pagedserve, args.model)
    print("python client test OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
