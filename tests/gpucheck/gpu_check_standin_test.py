#!/usr/bin/env python3
"""scripts/gpu-check --run with stand-in devices (CTest gpu_check_standin).

    gpu_check_standin_test.py --source-dir SRC

No build and no GPU: the bundle is made here from one small bash script
standing in for all five binaries (what it does is set by environment
variables: the probe's exit status, which call hangs), a stand-in
`nvidia-smi` on PATH that lists a GPU (or none), and stand-in fixture
generators. Each case checks summary.json in $OUT:

a. no false green: the probe exits 3 while nvidia-smi lists a GPU -> the
   device step failed, summary ok false, exit 1; the same probe with
   nvidia-smi listing nothing -> "no GPU: nothing measured", ok false, exit 4.
b. nothing lost: a run SIGKILLed (whole process group) once its device step
   has finished, while the next step hangs, leaves a parseable summary.json
   naming the finished steps (state "running", ok false) and the log tarball;
   a run sent SIGTERM there ends within seconds with state
   "interrupted: SIGTERM". Every summary.json read while a run goes on parses
   (written to a temporary name and renamed).
c. GPU_CHECK_QUICK=1 with a working stand-in device: exactly the quick steps,
   in order (attention bandwidth, model_bench at batch 1 and 64, each in its
   own invocation, CUDA vs CPU worker), none of the long ones called; ok true,
   exit 0 (the positive control for a and b).
d. the deadline: a hanging kernel test under a 24 s limit times out within
   it, and every later step is "not_run" with a "deadline" reason (not
   failed, not ok); the whole run ends within the limit plus a few seconds.
e. memcheck (a stand-in compute-sanitizer on PATH): one small kernel test
   under it (--gtest_filter), ok with its ERROR SUMMARY; "unsupported", not
   failed, when the sanitizer refuses the device.
   A memcheck that runs out of its time is "timeout", not failed, and the
   run goes on.
f. an attention benchmark cut off by the deadline after writing one shape
   (its JSON "partial") fails with the figures of that shape kept.
g. an attention benchmark that dies inside one variant (its JSON naming it in
   "running") is run again with --exclude that variant: the step fails
   naming it, keeps the second run's figures, the first run's JSON is in the
   logs, and the later steps run.
Standard library only; prints "N passed, N failed". About 40 s.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

BINS = ["kernels_cuda_kernels_test", "cuda_worker_test", "paged_attention_cuda_bench",
        "bench_model", "pagedserve"]
QUICK = ["libraries", "device", "attention_bench", "model_bench_b1", "model_bench_b64", "cuda_worker",
         "pagedserve", "memcheck"]
FULL = ["libraries", "device", "memcheck", "attention_bench", "model_bench_b1", "model_bench_b64",
        "cuda_worker", "kernel_tests", "model_bench_b32", "model_bench_b256", "model_bench_eager_b1",
        "model_bench_eager_b32", "sdpa_baseline", "pagedserve"]

# One stand-in for every bundled binary, by the name it is called under.
# STANDIN_PROBE_RC: the probe's exit status (0: a device; 3: none usable).
# STANDIN_HANG: calls that never end (attention, kernels, memcheck: the kernel
# test with a --gtest_filter, worker, model).
# STANDIN_CRASH_VARIANT: the attention benchmark dies (exit 134) inside this
# variant, naming it in its JSON's "running", unless run with --exclude it.
# STANDIN_CALLS: a file each call appends its name and arguments to.
STANDIN = r'''#!/usr/bin/env bash
name=$(basename "$0")
echo "$name $*" >>"${STANDIN_CALLS:-/dev/null}"
out=""
for a in "$@"; do
  case "$a" in
    --gtest_output=xml:*) out=${a#--gtest_output=xml:} ;;
    --benchmark_out=*) out=${a#--benchmark_out=} ;;
  esac
done
hang() {  # the pid goes to STANDIN_PIDS: the test ends it if a killed run leaves it
  case ",${STANDIN_HANG:-}," in *",$1,"*) echo $$ >>"${STANDIN_PIDS:-/dev/null}"; exec sleep 3600 ;; esac
}
case "$name" in
  paged_attention_cuda_bench)
    if [ "${1:-}" = --probe ]; then
      rc=${STANDIN_PROBE_RC:-0}
      if [ "$rc" = 0 ]; then echo "NVIDIA H200 (stand-in), sm_90"; exit 0; fi
      echo "no usable CUDA device: cudaGetDeviceCount: unknown error (stand-in)"; exit "$rc"
    fi
    # As the real one: the JSON rewritten after each shape ("partial" until the end).
    row='{"heads": 32, "kv_heads": 8, "dtype": "bf16", "batch": 8, "context": 1024, "attention": "GQA", "pct_of_copy_bw": 50.0, "kv_GBps": 2000.0, "paged_ms": 0.1, "variant": "gqa", "errors": []}'
    [ "${1:-}" = --json ] && echo '{"device": "stand-in", "copy_bandwidth_GBps": 4000.0, "results": ['"$row"'], "prefill": [], "partial": true}' >"$2"
    crash=${STANDIN_CRASH_VARIANT:-}
    if [ -n "$crash" ] && [[ " $* " != *" --exclude "*"$crash"* ]]; then
      printf '{\n  "device": "stand-in",\n  "copy_bandwidth_GBps": 4000.0,\n  "results": [\n    %s\n  ],\n  "running": "%s bf16 batch 8 context 4096 32/8",\n  "prefill": [],\n  "partial": true\n}\n' \
        "$row" "$crash" >"$2"
      echo "stand-in: fault in $crash" >&2
      exit 134
    fi
    hang attention
    [ "${1:-}" = --json ] && echo '{"device": "stand-in", "copy_bandwidth_GBps": 4000.0, "results": ['"$row"'], "prefill": []}' >"$2"
    ;;
  kernels_cuda_kernels_test|cuda_worker_test)
    if [ "$name" = kernels_cuda_kernels_test ]; then
      case "$*" in *--gtest_filter=*) hang memcheck ;; *) hang kernels ;; esac
    fi
    [ "$name" = cuda_worker_test ] && hang worker
    echo '<testsuites tests="2" failures="0" errors="0" disabled="0" time="0.1"><testsuite name="S"><testcase name="a" result="completed"/><testcase name="b" result="completed"/></testsuite></testsuites>' >"$out"
    ;;
  bench_model)
    hang model
    echo '{"benchmarks": []}' >"$out"
    ;;
  pagedserve) echo "usage: pagedserve serve|generate ..." ;;
esac
exit 0
'''

# nvidia-smi listing one H200, or (STANDIN_SMI_GPUS=0) none.
NVIDIA_SMI = r'''#!/usr/bin/env bash
if [ "${STANDIN_SMI_GPUS:-1}" = 0 ]; then echo "No devices were found"; exit 6; fi
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-stand-in)" ;;
  *--query-gpu*) echo "NVIDIA H200, 570.00, 143771 MiB, 9.0" ;;
  *) echo "stand-in nvidia-smi: NVIDIA H200" ;;
esac
'''

# compute-sanitizer: STANDIN_SANITIZER=unsupported refuses the device;
# otherwise it runs its target (after the options) and prints an ERROR SUMMARY.
SANITIZER = r'''#!/usr/bin/env bash
echo "compute-sanitizer $*" >>"${STANDIN_CALLS:-/dev/null}"
if [ "${STANDIN_SANITIZER:-}" = unsupported ]; then
  echo "========= Error: Device not supported (stand-in)"; exit 1
fi
while [ $# -gt 0 ] && [ "$1" != env ]; do shift; done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
'''

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok: {what}")
    else:
        failed += 1
        print(f"FAILED: {what}")
    return cond


def write_exec(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def make_bundle(tmp):
    stage = os.path.join(tmp, "stage")
    os.makedirs(os.path.join(stage, "bin"))
    os.makedirs(os.path.join(stage, "lib", "compat"))
    os.makedirs(os.path.join(stage, "fixtures"))
    for b in BINS:
        write_exec(os.path.join(stage, "bin", b), STANDIN)
    for g in ("make_random_llama.py", "make_random_variant.py"):
        write_exec(os.path.join(stage, "fixtures", g), "import sys\nsys.exit(0)\n")
    bundle = os.path.join(tmp, "bundle")
    os.makedirs(bundle)
    with open(os.path.join(bundle, "manifest.json"), "w") as f:
        json.dump({"format": 1, "commit": "stand-in", "binaries": {b: 1 for b in BINS}}, f)
    with tarfile.open(os.path.join(bundle, "payload.tar.xz"), "w:xz") as t:
        for n in ("bin", "lib", "fixtures"):
            t.add(os.path.join(stage, n), arcname=n)
    fakebin = os.path.join(tmp, "fakebin")
    os.makedirs(fakebin)
    write_exec(os.path.join(fakebin, "nvidia-smi"), NVIDIA_SMI)
    write_exec(os.path.join(fakebin, "compute-sanitizer"), SANITIZER)
    return bundle, fakebin


def kill_leftovers(marker):
    """SIGKILL, by pid, every process this test started that still runs (a
    killed run's `timeout` children live in their own process groups): the
    hanging stand-ins (their pids in STANDIN_PIDS) and those whose command
    line names the test's temporary folder."""
    pids = os.path.join(marker, "standin-pids.txt")
    if os.path.exists(pids):
        with open(pids) as f:
            for pid in f.read().split():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        is_standin = c.read().startswith(b"sleep\x003600")
                    if is_standin:
                        os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


class Runner:
    def __init__(self, script, tmp, bundle, fakebin):
        self.script, self.tmp, self.bundle, self.fakebin = script, tmp, bundle, fakebin
        self.n = 0

    def env(self, extra):
        self.n += 1
        out = os.path.join(self.tmp, f"out{self.n}")
        work = os.path.join(self.tmp, f"tmp{self.n}")
        os.makedirs(work)
        env = dict(os.environ)
        env.pop("GPU_CHECK_QUICK", None)
        env.pop("GPU_CHECK_TIME_LIMIT", None)
        env.update({"GPU_CHECK_BUNDLE": self.bundle, "OUT": out, "TMPDIR": work,
                    "PATH": self.fakebin + os.pathsep + env.get("PATH", ""),
                    "STANDIN_CALLS": os.path.join(self.tmp, f"calls{self.n}.txt"),
                    "STANDIN_PIDS": os.path.join(self.tmp, "standin-pids.txt")})
        env.update(extra)
        return env, out

    def run(self, extra, timeout=120):
        env, out = self.env(extra)
        t0 = time.monotonic()
        p = subprocess.run([self.script, "--run"], env=env, cwd=self.tmp, capture_output=True, text=True,
                           timeout=timeout)
        print(p.stderr[-1500:])
        return p.returncode, load(out), out, env["STANDIN_CALLS"], time.monotonic() - t0


def load(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def calls(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def case_false_green(r):
    rc, s, _, _, _ = r.run({"STANDIN_PROBE_RC": "3"})
    st = s["steps"]
    check(rc == 1, f"(a) probe exit 3 with a listed GPU: --run exits 1 (got {rc})")
    check(s["ok"] is False, "(a) summary ok is false")
    check(st["device"]["status"] == "failed" and "nvidia-smi lists 1 GPU" in st["device"]["reason"]
          and "unknown error (stand-in)" in st["device"]["reason"],
          f"(a) device step failed with the reason: {st['device']}")
    check(all(st[n]["status"] != "ok" for n in st if n not in ("libraries", "pagedserve")),
          f"(a) no GPU step ok: {[(n, v['status']) for n, v in st.items()]}")

    rc, s, _, _, _ = r.run({"STANDIN_PROBE_RC": "3", "STANDIN_SMI_GPUS": "0"})
    st = s["steps"]
    check(rc == 4, f"(a) no GPU listed, probe exit 3: --run exits 4 (got {rc})")
    check(s["ok"] is False and s["reason"] == "no GPU: nothing measured",
          f"(a) no GPU: ok false, reason {s['reason']!r}")
    check(st["device"]["status"] == "skipped" and st["device"]["reason"].startswith("no GPU"),
          f"(a) device skipped for no GPU: {st['device']}")
    check(st["attention_bench"]["status"] == "skipped" and
          st["attention_bench"]["reason"].startswith("no GPU"),
          f"(a) attention_bench skipped for no GPU: {st['attention_bench']}")


def case_killed(r, sig):
    """Start a run whose attention benchmark hangs; once summary.json names
    the finished device step, send SIG to the run's process group."""
    env, out = r.env({"STANDIN_HANG": "attention", "GPU_CHECK_QUICK": "1"})
    p = subprocess.Popen([r.script, "--run"], env=env, cwd=r.tmp, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    name = signal.Signals(sig).name
    seen, unparsed, deadline = None, 0, time.monotonic() + 60
    try:
        while time.monotonic() < deadline and p.poll() is None:
            try:
                s = load(out)
                if "device" in s["steps"]:
                    seen = s
                    break
            except FileNotFoundError:
                pass
            except json.JSONDecodeError:
                unparsed += 1
            time.sleep(0.05)  # polling interval, not synchronisation: the loop waits on the file
        check(seen is not None, f"(b/{name}) summary.json names the device step while the run goes on")
        check(unparsed == 0, f"(b/{name}) every summary.json read parsed ({unparsed} did not)")
        t_sig = time.monotonic()
        os.killpg(p.pid, sig)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        ended = time.monotonic() - t_sig
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        kill_leftovers(r.tmp)
    s = load(out)
    st = s["steps"]
    check(st.get("libraries", {}).get("status") == "ok" and st.get("device", {}).get("status") == "ok",
          f"(b/{name}) summary.json after the kill names the finished steps: {list(st)}")
    check("attention_bench" not in st and s["ok"] is False,
          f"(b/{name}) the cut-off step is not recorded and ok is false (state {s['state']!r})")
    check(os.path.exists(os.path.join(out, "gpu-check-logs.tar.gz")),
          f"(b/{name}) the log tarball is in $OUT")
    leftovers = [n for n in os.listdir(out) if n.endswith(".tmp")]
    if sig == signal.SIGKILL:
        check(s["state"] == "running", f"(b/SIGKILL) state still 'running': {s['state']!r}")
    else:
        check(p.returncode == 143 and ended < 20,
              f"(b/SIGTERM) the run ends at once (rc {p.returncode}, {ended:.1f} s after the signal)")
        check(s["state"] == "interrupted: SIGTERM", f"(b/SIGTERM) state {s['state']!r}")
        check(not leftovers, f"(b/SIGTERM) no temporary files left in $OUT: {leftovers}")


def case_quick(r):
    rc, s, out, callfile, _ = r.run({"GPU_CHECK_QUICK": "1"})
    st = s["steps"]
    check(rc == 0 and s["ok"] is True and s["state"] == "done",
          f"(c) quick run with a working stand-in device: exit 0, ok (rc {rc}, {s['ok']}, {s['reason']!r})")
    check(list(st) == QUICK, f"(c) exactly the quick steps, in order: {list(st)}")
    check(s["time_limit"] == 180, f"(c) quick time limit 180 s: {s['time_limit']}")
    check(sorted(s["not_selected"]) == sorted(set(FULL) - set(QUICK)),
          f"(c) the long steps are listed as not selected: {s['not_selected']}")
    cl = calls(callfile)
    check(not any(c.startswith("kernels_cuda_kernels_test") and "--gtest_filter=" not in c for c in cl) and
          not any("--enforce-eager" in c for c in cl), f"(c) no long step was called: {cl}")
    check(st["memcheck"]["status"] == "ok", f"(c) memcheck last, in the time left: {st['memcheck']}")
    models = [c for c in cl if c.startswith("bench_model")]
    check(len(models) == 2 and "--batches=1 " in models[0] and "--batches=64 " in models[1],
          f"(c) bench_model once per batch size, 1 then 64: {models}")
    check(any(c.startswith("paged_attention_cuda_bench --json") and "--quick" in c for c in cl),
          "(c) the attention benchmark ran with --quick")
    check(sorted(os.listdir(out)) == ["gpu-check-logs.tar.gz", "summary.json"],
          f"(c) $OUT holds the summary and the log tarball only: {sorted(os.listdir(out))}")


def case_deadline(r):
    limit = 24
    rc, s, _, _, secs = r.run({"STANDIN_HANG": "kernels", "GPU_CHECK_TIME_LIMIT": str(limit),
                               "GPU_CHECK_RESERVE_SECONDS": "2", "GPU_CHECK_MIN_STEP_SECONDS": "5"})
    st = s["steps"]
    check(list(st) == FULL, f"(d) every step recorded: {list(st)}")
    check(st["kernel_tests"]["status"] == "failed" and "timed out" in st["kernel_tests"]["reason"],
          f"(d) the hanging step times out inside the deadline: {st['kernel_tests']}")
    late = FULL[FULL.index("kernel_tests") + 1:]
    check(all(st[n]["status"] == "not_run" and st[n]["reason"].startswith("deadline") for n in late),
          f"(d) every later step is not_run for the deadline: {[(n, st[n]['status']) for n in late]}")
    early = FULL[:FULL.index("kernel_tests")]
    check(all(st[n]["status"] in ("ok", "skipped") for n in early),
          f"(d) the steps before ran: {[(n, st[n]['status']) for n in early]}")
    check(s["state"] == "done: deadline", f"(d) state {s['state']!r}")
    check(secs < limit + 8, f"(d) the run took {secs:.1f} s for a {limit} s limit")
    check(rc == 1, f"(d) exit 1 (the timed-out step failed; got {rc})")


def case_partial(r):
    rc, s, _, _, _ = r.run({"GPU_CHECK_STEPS": "libraries,device,attention_bench", "STANDIN_HANG": "attention",
                            "GPU_CHECK_TIME_LIMIT": "14", "GPU_CHECK_RESERVE_SECONDS": "2",
                            "GPU_CHECK_MIN_STEP_SECONDS": "3"})
    a = s["steps"]["attention_bench"]
    check(a["status"] == "failed" and "timed out" in a["reason"] and a["figures"].get("partial") is True
          and a["figures"].get("shapes") == 1,
          f"(f) an attention benchmark cut off keeps the shapes it finished: {a}")


def case_memcheck(r):
    steps = {"GPU_CHECK_STEPS": "libraries,device,memcheck"}
    rc, s, _, callfile, _ = r.run(steps)
    st = s["steps"]
    check(rc == 0 and st["memcheck"]["status"] == "ok" and st["memcheck"]["figures"].get("errors") == 0,
          f"(e) memcheck with a stand-in sanitizer: ok, 0 errors ({rc}, {st['memcheck']})")
    cl = [c for c in calls(callfile) if c.startswith("kernels_cuda_kernels_test")]
    check(len(cl) == 1 and "--gtest_filter=CudaKernelsTest.ZeroQueryGivesMeanOfValuesAndPaddingDoesNotLeak" in cl[0],
          f"(e) memcheck runs one small kernel test: {cl}")
    rc, s, _, _, _ = r.run({**steps, "STANDIN_SANITIZER": "unsupported"})
    st = s["steps"]
    check(st["memcheck"]["status"] == "unsupported" and "Device not supported" in st["memcheck"]["reason"],
          f"(e) a sanitizer that refuses the device: unsupported ({st['memcheck']})")
    check(rc == 0 and s["ok"] is True, f"(e) unsupported is not a failure (rc {rc}, ok {s['ok']})")


def case_memcheck_timeout(r):
    rc, s, _, _, secs = r.run({"GPU_CHECK_STEPS": "libraries,device,memcheck,pagedserve", "STANDIN_HANG": "memcheck",
                               "GPU_CHECK_MEMCHECK_SECONDS": "3"})
    st = s["steps"]
    check(st["memcheck"]["status"] == "timeout" and "timed out after 3s" in st["memcheck"]["reason"],
          f"(e) a memcheck out of time is 'timeout': {st['memcheck']}")
    check(st["pagedserve"]["status"] == "ok" and rc == 0 and s["ok"] is True and secs < 20,
          f"(e) a memcheck timeout fails nothing and the run goes on (rc {rc}, {secs:.1f} s)")


def case_variant_crash(r):
    rc, s, out, callfile, _ = r.run({"GPU_CHECK_STEPS": "libraries,device,attention_bench,model_bench_b1",
                                     "STANDIN_CRASH_VARIANT": "gqa_mma"})
    st = s["steps"]
    a = st["attention_bench"]
    check(a["status"] == "failed" and "gqa_mma died in gqa_mma bf16 batch 8 context 4096" in a["reason"]
          and "--exclude gqa_mma" in a["reason"],
          f"(g) a variant dying fails the step, naming it: {a}")
    check(a["figures"].get("shapes") == 1 and not a["figures"].get("partial"),
          f"(g) the figures of the run without it are kept: {a['figures']}")
    bench = [c for c in calls(callfile) if c.startswith("paged_attention_cuda_bench --json")]
    check(len(bench) == 2 and "--exclude" not in bench[0] and bench[1].endswith("--exclude gqa_mma"),
          f"(g) the benchmark ran again without the variant: {bench}")
    check(st["model_bench_b1"]["status"] == "ok" and rc == 1,
          f"(g) the later steps still ran (rc {rc}): {st['model_bench_b1']}")
    with tarfile.open(os.path.join(out, "gpu-check-logs.tar.gz")) as t:
        names = t.getnames()
    check("logs/attention-run1.json" in names, f"(g) the first run's JSON is in the logs: {names}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    script = os.path.join(args.source_dir, "scripts", "gpu-check")
    with tempfile.TemporaryDirectory(prefix="gpu-check-standin.") as tmp:
        try:
            bundle, fakebin = make_bundle(tmp)
            r = Runner(script, tmp, bundle, fakebin)
            case_false_green(r)
            case_killed(r, signal.SIGKILL)
            case_killed(r, signal.SIGTERM)
            case_quick(r)
            case_deadline(r)
            case_memcheck(r)
            case_memcheck_timeout(r)
            case_partial(r)
            case_variant_crash(r)
        finally:
            kill_leftovers(tmp)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any crash is a failure of the test
        failed += 1
        print(f"FAILED: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)
