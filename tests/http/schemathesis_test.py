#!/usr/bin/env python3
"""schemathesis against GET /openapi.json of a real `pagedserve serve`.

A bounded number of generated requests per operation (valid and invalid bodies,
both endpoints, streaming and not): no 5xx, the server stays alive and healthy, and
no KV block is left allocated afterwards. The server runs with --max-model-len 64
and --max-num-seqs 8 so that any admitted request finishes in seconds on a CPU.

  schemathesis_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL.gguf [--examples N]
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_test  # noqa: E402  (ServerProcess, http, metric, wait_blocks_free)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pagedserve", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--examples", type=int, default=8, help="generated requests per operation")
    # CI runs the fuzzing phase only (about 40 s on 2 loaded cores); "coverage,fuzzing"
    # adds schemathesis' boundary-value phase (about 700 more requests, 4 minutes).
    parser.add_argument("--phases", default="fuzzing")
    args = parser.parse_args()
    http_test.require_model("schemathesis_test", args.model)
    exe = shutil.which("schemathesis") or shutil.which("st")
    if exe is None:
        print("schemathesis_test: schemathesis is missing (pip install schemathesis); skipping")
        return 77
    http_test.ARGS = args
    http_test.MAX_MODEL_LEN = 64
    server = http_test.ServerProcess(extra=["--max-num-seqs=8", "--disable-log-requests"])
    ok = False
    try:
        cmd = [exe, "run", server.url + "/openapi.json", "--checks", "not_a_server_error",
               "--max-examples", str(args.examples), "--workers", "1", "--request-timeout", "60",
               "--seed", "12345", "--phases", args.phases]
        print("schemathesis_test:", " ".join(cmd), flush=True)
        t0 = time.time()
        run = subprocess.run(cmd, timeout=400)
        print(f"schemathesis_test: schemathesis exited {run.returncode} after {time.time() - t0:.0f} s", flush=True)
        status, body = http_test.http("GET", server.url + "/health")
        alive = server.proc.poll() is None and status == 200
        freed = alive and http_test.wait_blocks_free(server.url)
        print(f"schemathesis_test: alive={alive} kv_blocks_freed={freed}")
        ok = run.returncode == 0 and alive and freed
    finally:
        rc = server.stop()
    if rc != 0 or not ok:
        print(server.logs()[-6000:], file=sys.stderr)
    return 0 if ok and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
