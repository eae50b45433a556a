#!/usr/bin/env python3
"""scripts/gpu-check --prepare and --run without a GPU (CTest gpu_check_bundle).

    gpu_check_test.py --source-dir SRC --build-dir BUILD

1. --prepare with GPU_CHECK_BUILD_DIR=BUILD (no build: GPU_CHECK_NO_BUILD=1)
   into a temporary bundle folder: exit 0, the bundle path as the last line of
   stdout, the layout (manifest.json + payload.tar.xz holding bin/ with the five
   binaries without debug info, lib/, fixtures/), the size limit, and that with
   only the bundle on
   LD_LIBRARY_PATH every library a binary loads is bundled or one the GPU
   machine provides (C library family, driver, NCCL, cuBLAS).
2. --run on that bundle with CUDA_VISIBLE_DEVICES="" (no device visible, on any
   machine without nvidia-smi listing a GPU): exit 4, summary.json ok false
   with the reason "no GPU: nothing measured", every GPU step skipped for "no
   GPU: no usable CUDA device", the library and pagedserve steps ok, and the
   log tarball. (tests/gpucheck/gpu_check_standin_test.py covers the rest of
   --run with stand-in devices: a probe failure with a listed GPU, a run
   killed midway, quick mode, the deadline.)
   Where root, unshare and chroot are available (CI), the same binaries are
   also started in a root holding only the C library family, NCCL and the
   payload: they must load there.
   2b. The same --run with a stand-in probe that reports a device (/bin/true):
   a device test that skips (the real cuda_worker_test, devices hidden), one
   that exits 0 without output (kernels_cuda_kernels_test replaced by
   /bin/true) and a benchmark without its JSON each fail the step, and --run
   exits 1. (The memcheck step's output check is not exercised: it needs
   compute-sanitizer.)
3. Broken inputs must fail --prepare with a clear message: a size limit below
   the bundle's size, and a build dir whose nvcc flags lack sm_90 (only sm_80).
Standard library only; prints "N passed, N failed".
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

BINS = ["kernels_cuda_kernels_test", "cuda_worker_test", "paged_attention_cuda_bench",
        "bench_model", "pagedserve"]
GPU_STEPS = ["attention_bench", "model_bench_b1", "model_bench_b64", "cuda_worker", "kernel_tests",
             "model_bench_b32", "model_bench_b256", "model_bench_eager_b1", "model_bench_eager_b32",
             "sdpa_baseline", "memcheck"]
PROVIDED = re.compile(r"^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|"
                      r"libdl\.so|librt\.so|libresolv\.so|libutil\.so|libcuda\.so|libnvidia-|"
                      r"libnccl\.so|libcublas\.so|libcublasLt\.so)")
MIB64 = 64 << 20

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


def run(cmd, env_extra, cwd, timeout=240):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def has_debug_info(path):
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True).stdout
    return ".debug_info" in out


def bare_root_check(payload, tmp):
    """The bundle in a root that holds only the C library family, NCCL (bind
    mounted) and the payload, as on a bare GPU machine: every binary loads
    (pagedserve prints its usage, the probe answers, the GTest binaries list
    their tests). Needs root, unshare and chroot; said and left out otherwise."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("chroot"):
        print("note: bare-root check not run (needs root, unshare and chroot)")
        return
    root = os.path.join(tmp, "bare")
    host_libs = {}
    for b in BINS:
        ldd = subprocess.run(["ldd", os.path.join(payload, "bin", b)], capture_output=True, text=True,
                             env={**os.environ, "LD_LIBRARY_PATH": f"{payload}/lib"}).stdout
        for m in re.finditer(r"^\s*(\S+) => (/\S+)", ldd, re.M):
            if PROVIDED.match(m.group(1)):
                host_libs[m.group(1)] = m.group(2)
        m = re.search(r"^\s*(/\S*ld-linux\S*)", ldd, re.M)
        if m:
            host_libs["interp"] = m.group(1)
    nccl = host_libs.pop("libnccl.so.2", None)
    if nccl is None:
        print("note: bare-root check not run (no libnccl.so.2 on this machine)")
        return
    os.makedirs(os.path.join(root, "glibc"))
    for d in ("bundle", "nccl", "proc", "dev", "tmp"):
        os.makedirs(os.path.join(root, d))
    for name, path in host_libs.items():
        if name == "interp":
            dest = os.path.join(root, path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy(os.path.realpath(path), dest)
        elif not name.startswith(("libcuda", "libnvidia", "libcublas")):
            shutil.copy(os.path.realpath(path), os.path.join(root, "glibc", name))
    shutil.copytree(payload, os.path.join(root, "bundle"), dirs_exist_ok=True)
    libpath = "/bundle/lib:/bundle/lib/compat:/glibc:/nccl"
    script = (f"mount --bind {os.path.dirname(os.path.realpath(nccl))} {root}/nccl && "
              f"mount -t proc proc {root}/proc && "
              f"unset PAGEDSERVE_BENCH_MODEL; export LD_LIBRARY_PATH={libpath} CUDA_VISIBLE_DEVICES= && "
              f"echo '== pagedserve' && chroot {root} /bundle/bin/pagedserve --help && "
              f"echo '== probe' && {{ chroot {root} /bundle/bin/paged_attention_cuda_bench --probe; "
              f"echo probe-rc=$?; }} && "
              f"echo '== kernels' && chroot {root} /bundle/bin/kernels_cuda_kernels_test --gtest_list_tests && "
              f"echo '== worker' && chroot {root} /bundle/bin/cuda_worker_test --gtest_list_tests && "
              f"echo '== bench_model' && {{ chroot {root} /bundle/bin/bench_model --benchmark_list_tests; "
              f"echo bench-rc=$?; }}")
    r = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    print(out[-2000:])
    check(r.returncode == 0 and "usage: pagedserve" in out, "bare root: pagedserve loads and prints its usage")
    check("probe-rc=3" in out and "no usable CUDA device" in out, "bare root: the CUDA probe answers")
    check("CudaKernelsTest." in out, "bare root: kernels_cuda_kernels_test loads")
    check("CudaWorkerTest." in out, "bare root: cuda_worker_test loads")
    # Without --model or --random-weights bench_model stops with its usage (exit 2).
    check("bench-rc=2" in out and "error while loading" not in out, "bare root: bench_model loads")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    script = os.path.join(args.source_dir, "scripts", "gpu-check")
    tmp = tempfile.mkdtemp(prefix="gpu-check-test.")
    try:
        bundle = os.path.join(tmp, "bundle")
        base_env = {"GPU_CHECK_BUILD_DIR": args.build_dir, "GPU_CHECK_NO_BUILD": "1",
                    "GPU_CHECK_BUNDLE": bundle}

        # --- 1. --prepare
        p = run([script, "--prepare"], base_env, args.source_dir)
        print(p.stderr[-3000:])
        if not check(p.returncode == 0, f"--prepare exits 0 (got {p.returncode})"):
            return
        lines = p.stdout.strip().splitlines()
        check(lines and lines[-1] == bundle, f"last stdout line is the bundle path ({lines[-1:]})")
        check(sorted(os.listdir(bundle)) == ["manifest.json", "payload.tar.xz"],
              f"bundle holds manifest.json and payload.tar.xz: {sorted(os.listdir(bundle))}")
        payload = os.path.join(tmp, "payload")
        with tarfile.open(os.path.join(bundle, "payload.tar.xz")) as t:
            t.extractall(payload)
        for b in BINS:
            path = os.path.join(payload, "bin", b)
            check(os.path.isfile(path) and os.access(path, os.X_OK), f"bin/{b} is an executable")
            check(not has_debug_info(path), f"bin/{b} has no debug info")
        libs = os.listdir(os.path.join(payload, "lib"))
        check(any(n.startswith("libcudart.so") for n in libs), "lib/ holds libcudart")
        check(any(n.startswith("libabsl_") for n in libs), "lib/ holds the Abseil libraries")
        check(not any(PROVIDED.match(n) for n in libs), "lib/ holds no library the GPU machine provides")
        fx = os.path.join(payload, "fixtures")
        check(all(os.path.isfile(os.path.join(fx, *f)) for f in [
            ("make_random_llama.py",), ("random_llama", "reference.json"),
            ("smollm2-tokenizer", "tokenizer.json"), ("make_random_variant.py",),
            ("qwen2_bias", "reference.json"), ("qwen3_qk_norm", "reference.json"),
            ("spm-tiny-tokenizer", "tokenizer.json")]),
              "fixtures/ holds the random-model generators, their references and tokenizers")
        with open(os.path.join(bundle, "manifest.json")) as f:
            manifest = json.load(f)
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(bundle) for n in ns)
        check(size <= MIB64, f"bundle is {size} bytes <= 64 MiB")
        check(manifest["bytes"] <= manifest["max_bytes"] == MIB64 and
              manifest["bytes"] + manifest["working_tree_bytes"] <= MIB64,
              f"manifest: {manifest['bytes']} + {manifest['working_tree_bytes']} bytes within the limit")
        check(sorted(manifest["binaries"]) == sorted(BINS), "manifest lists the five binaries")
        check({"libnccl.so.2", "libcublas.so.13"} <= set(manifest["from_device"]),
              "manifest names NCCL and cuBLAS as taken from the GPU machine")
        check("90" in re.split(r"[;-]", manifest["cuda_architectures"]), "manifest: sm_90 built")
        # Self-containment, checked here independently of the script's own check.
        outside = []
        for b in BINS:
            ldd = subprocess.run(["ldd", os.path.join(payload, "bin", b)], capture_output=True, text=True,
                                 env={**os.environ, "LD_LIBRARY_PATH":
                                      f"{payload}/lib:{payload}/lib/compat"}).stdout
            for m in re.finditer(r"^\s*(\S+) => (\S+)", ldd, re.M):
                name, path = m.groups()
                if not PROVIDED.match(name) and not path.startswith(payload + "/lib/"):
                    outside.append(f"{b}: {name} => {path}")
        check(not outside, f"every other library resolves inside the bundle {outside[:5]}")

        bare_root_check(payload, tmp)

        # --- 2. --run without a visible device
        out = os.path.join(tmp, "out")
        r = run([script, "--run"], {"GPU_CHECK_BUNDLE": bundle, "OUT": out, "CUDA_VISIBLE_DEVICES": ""},
                tmp)
        print(r.stderr[-3000:])
        check(r.returncode == 4, f"--run exits 4 without a GPU (got {r.returncode})")
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        steps = summary["steps"]
        check(summary["ok"] is False and summary["reason"] == "no GPU: nothing measured",
              f"summary not ok without a GPU: {summary['reason']!r}")
        check(steps["libraries"]["status"] == "ok", f"libraries ok ({steps['libraries']})")
        check(steps["device"]["status"] == "skipped" and
              steps["device"]["reason"].startswith("no GPU: no usable CUDA device"),
              f"device skipped: {steps['device']['reason']}")
        for s in GPU_STEPS:
            check(steps[s]["status"] == "skipped" and steps[s]["reason"].startswith("no GPU: no usable CUDA device"),
                  f"{s} skipped: {steps[s]['reason']}")
        check(steps["pagedserve"]["status"] == "ok", f"pagedserve loads ({steps['pagedserve']})")
        check(summary["bundle"]["binaries"] == manifest["binaries"], "summary carries the manifest")
        files = sorted(os.listdir(out))
        check(files == ["gpu-check-logs.tar.gz", "summary.json"], f"$OUT holds two files: {files}")
        with tarfile.open(os.path.join(out, "gpu-check-logs.tar.gz")) as t:
            names = t.getnames()
        for n in ["logs/summary.json", "logs/libraries.log", "logs/probe.log", "logs/pagedserve.log"]:
            check(n in names, f"tarball holds {n}")

        # --- 2b. a device that answers the probe, but device tests that skip or
        # print nothing: those steps must fail, never read as passed. The probe
        # binary is replaced by /bin/true (exit 0: "a device"; as the benchmark it
        # writes no JSON); cuda_worker_test is the real binary, which skips
        # without a device (CUDA_VISIBLE_DEVICES=""); kernels_cuda_kernels_test is
        # /bin/true too, exiting 0 without running anything. (ELF stand-ins: the
        # libraries step runs ldd on every binary.)
        stub_pay = os.path.join(tmp, "stub-payload")
        shutil.copytree(payload, stub_pay, symlinks=True)
        for name in ("paged_attention_cuda_bench", "kernels_cuda_kernels_test"):
            path = os.path.join(stub_pay, "bin", name)
            os.remove(path)
            shutil.copy("/bin/true", path)
            os.chmod(path, 0o755)
        stub_bundle = os.path.join(tmp, "stub-bundle")
        os.makedirs(stub_bundle)
        shutil.copy(os.path.join(bundle, "manifest.json"), stub_bundle)
        with tarfile.open(os.path.join(stub_bundle, "payload.tar.xz"), "w:xz") as t:
            for n in sorted(os.listdir(stub_pay)):
                t.add(os.path.join(stub_pay, n), arcname=n)
        stub_out = os.path.join(tmp, "stub-out")
        r = run([script, "--run"], {"GPU_CHECK_BUNDLE": stub_bundle, "OUT": stub_out, "CUDA_VISIBLE_DEVICES": "",
                                    "GPU_CHECK_MODEL_LAYERS": "1"}, tmp, timeout=600)
        print(r.stderr[-3000:])
        check(r.returncode == 1, f"--run exits 1 when device steps skip or print nothing (got {r.returncode})")
        with open(os.path.join(stub_out, "summary.json")) as f:
            summary = json.load(f)
        steps = summary["steps"]
        check(summary["ok"] is False, "stand-in device: summary not ok")
        check(steps["device"]["status"] == "ok", f"stand-in device: probe ok ({steps['device']})")
        check(steps["kernel_tests"]["status"] == "failed" and
              steps["kernel_tests"]["reason"].startswith("no test output"),
              f"kernel_tests with no output fails: {steps['kernel_tests']}")
        check(steps["cuda_worker"]["status"] == "failed",
              f"cuda_worker_test that skips fails: {steps['cuda_worker']}")
        check(steps["attention_bench"]["status"] == "failed" and
              steps["attention_bench"]["reason"].startswith("no output"),
              f"attention_bench without its JSON fails: {steps['attention_bench']}")
        check(all(st["status"] != "ok" for n, st in steps.items() if n in GPU_STEPS),
              f"no GPU step reads ok: {[(n, st['status']) for n, st in steps.items() if n in GPU_STEPS]}")

        # --- 3. broken inputs
        small = run([script, "--prepare"], {**base_env, "GPU_CHECK_BUNDLE": os.path.join(tmp, "b2"),
                                            "GPU_CHECK_MAX_BYTES": "100000",
                                            "GPU_CHECK_XZ_LEVEL": "0"}, args.source_dir)
        check(small.returncode == 1 and "over the limit" in small.stderr,
              f"a bundle over GPU_CHECK_MAX_BYTES fails --prepare ({small.returncode})")
        fake = os.path.join(tmp, "build-sm80")
        os.makedirs(fake)
        with open(os.path.join(args.build_dir, "CMakeCache.txt")) as f:
            cache = re.sub(r"^CMAKE_CUDA_ARCHITECTURES:(\w*)=.*$", r"CMAKE_CUDA_ARCHITECTURES:\1=80",
                           f.read(), flags=re.M)
        with open(os.path.join(fake, "CMakeCache.txt"), "w") as f:
            f.write(cache)
        with open(os.path.join(fake, "build.ninja"), "w") as f:
            f.write("FLAGS = --generate-code=arch=compute_80,code=[compute_80,sm_80]\n")
        sm80 = run([script, "--prepare"], {**base_env, "GPU_CHECK_BUILD_DIR": fake,
                                           "GPU_CHECK_BUNDLE": os.path.join(tmp, "b3")}, args.source_dir)
        check(sm80.returncode == 1 and "lacks 90" in sm80.stderr,
              f"a build dir without sm_90 fails --prepare ({sm80.returncode}: {sm80.stderr.strip()[-200:]})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any crash is a failure of the test
        failed += 1
        print(f"FAILED: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)
