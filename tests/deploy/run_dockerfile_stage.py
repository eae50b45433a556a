#!/usr/bin/env python3
"""Runs one stage of a Dockerfile in a Debian 12 root made with debootstrap.

No container engine runs in CI, so the CPU image's build stage
(deploy/Dockerfile.cpu, `FROM debian:12 AS build`) is executed here the way
`docker build` would: in a fresh Debian 12 (bookworm) root, instruction by
instruction, as root in a chroot.

    run_dockerfile_stage.py [--dockerfile deploy/Dockerfile.cpu] [--stage build]
                            [--root DIR] [--keep] [--mirror URL]

Supported instructions: FROM (must name debian:12 or debian:12-slim: the root
is bookworm minbase), SHELL, ENV, ARG, WORKDIR, COPY (from the build context;
--from is an error in the stage run), RUN; LABEL, EXPOSE, VOLUME, USER,
HEALTHCHECK, STOPSIGNAL, ENTRYPOINT and CMD do not change what is built and
are skipped with a note. The build context is the repository root, filtered by
<Dockerfile>.dockerignore (allow-list form: `*` then `!path` lines).

Exit codes: 0 every instruction succeeded, 1 an instruction failed (its output
is shown), 77 cannot run here (not root, no debootstrap or chroot: CTest skip).
Takes minutes (debootstrap, apt, a Release build): CTest label `slow`, not in
scripts/test.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def instructions(path):
    """(keyword, argument text) pairs, continuation lines joined, comments dropped."""
    out, current = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not current and (line.lstrip().startswith("#") or not line.strip()):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # comment lines inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, arg = current.strip().partition(" ")
        out.append((keyword.upper(), arg.strip()))
        current = ""
    return out


def stage(instrs, name):
    body, inside = [], False
    for kw, arg in instrs:
        if kw == "FROM":
            if inside:
                break
            words = arg.split()
            if len(words) >= 3 and words[-2].upper() == "AS" and words[-1] == name:
                if words[0] not in ("debian:12", "debian:12-slim", "debian:bookworm"):
                    sys.exit(f"stage {name} is FROM {words[0]}: only Debian 12 stages run here")
                inside = True
            continue
        if inside:
            body.append((kw, arg))
    if not inside:
        sys.exit(f"no stage '{name}'")
    return body


def allowed(context_path, ignore_lines):
    """True when the allow-list .dockerignore lets `context_path` into the context."""
    allow = [l[1:].rstrip("/") for l in ignore_lines if l.startswith("!")]
    return any(context_path == a or context_path.startswith(a + "/") for a in allow)


def run(cmd, **kw):
    return subprocess.run(cmd, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dockerfile", default=os.path.join(ROOT, "deploy", "Dockerfile.cpu"))
    ap.add_argument("--stage", default="build")
    ap.add_argument("--root", help="Debian root (made when missing; default a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the root afterwards")
    ap.add_argument("--mirror", default="http://deb.debian.org/debian")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (debootstrap, chroot)")
        return 77
    for tool in ("debootstrap", "chroot", "mount"):
        if not shutil.which(tool):
            print(f"SKIP: {tool} not found (apt-get install debootstrap)")
            return 77

    body = stage(instructions(args.dockerfile), args.stage)
    ignore_path = args.dockerfile + ".dockerignore"
    ignore = [l.strip() for l in open(ignore_path) if l.strip() and not l.startswith("#")]
    root = args.root or tempfile.mkdtemp(prefix="pagedserve-debian12-", dir="/var/tmp")
    mounts = []
    start = time.time()
    try:
        if not os.path.exists(os.path.join(root, "etc", "debian_version")):
            print(f"debootstrap bookworm into {root}", flush=True)
            r = run(["debootstrap", "--variant=minbase", "bookworm", root, args.mirror])
            if r.returncode != 0:
                print("debootstrap failed")
                return 1
        for src, dst, opts in (("proc", "proc", ["-t", "proc"]), ("/dev", "dev", ["--bind"]),
                               ("/dev/pts", "dev/pts", ["--bind"])):
            target = os.path.join(root, dst)
            os.makedirs(target, exist_ok=True)
            if run(["mount"] + opts + [src, target]).returncode == 0:
                mounts.append(target)
        shutil.copy("/etc/resolv.conf", os.path.join(root, "etc", "resolv.conf"))

        shell, env, workdir = ["/bin/sh", "-c"], {"PATH": "/usr/local/sbin:/usr/local/bin:"
                                                          "/usr/sbin:/usr/bin:/sbin:/bin",
                                                  "HOME": "/root"}, "/"
        for n, (kw, arg) in enumerate(body, 1):
            t0 = time.time()
            print(f"[{n}/{len(body)}] {kw} {arg[:100]}", flush=True)
            if kw == "SHELL":
                shell = json.loads(arg)
            elif kw in ("ENV", "ARG"):
                for word in shlex.split(arg):
                    key, sep, value = word.partition("=")
                    if kw == "ARG" and not sep:
                        continue  # an ARG without default stays unset, as in docker build
                    env[key] = value
            elif kw == "WORKDIR":
                workdir = os.path.join(workdir, arg)
                os.makedirs(os.path.join(root, workdir.lstrip("/")), exist_ok=True)
            elif kw == "COPY":
                words = shlex.split(arg)
                if any(w.startswith("--from") for w in words):
                    print(f"COPY --from is not part of a single stage: {arg}")
                    return 1
                *srcs, dst = [w for w in words if not w.startswith("--")]
                dst_abs = os.path.join(root, os.path.join(workdir, dst).lstrip("/"))
                for src in srcs:
                    rel = src.rstrip("/")
                    if not allowed(rel, ignore):
                        print(f"COPY {src}: excluded by {os.path.basename(ignore_path)}")
                        return 1
                    path = os.path.join(ROOT, rel)
                    if os.path.isdir(path):
                        shutil.copytree(path, dst_abs, dirs_exist_ok=True)
                    else:
                        target = dst_abs if not dst.endswith("/") else os.path.join(
                            dst_abs, os.path.basename(rel))
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        shutil.copy2(path, target)
            elif kw == "RUN":
                cmd = ["chroot", root, "/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in env.items()]
                cmd += shell + [f"cd {shlex.quote(workdir)} && {arg}"]
                r = run(cmd)
                if r.returncode != 0:
                    print(f"RUN failed with exit code {r.returncode}: {arg}")
                    return 1
            else:
                print(f"  ({kw} does not change what is built: skipped)")
            print(f"  done in {time.time() - t0:.0f} s", flush=True)
        print(f"stage {args.stage} of {os.path.relpath(args.dockerfile, ROOT)} ran in a Debian 12 "
              f"root in {time.time() - start:.0f} s")
        return 0
    finally:
        for m in reversed(mounts):
            run(["umount", "-l", m])
        still = [m for m in mounts if os.path.ismount(m)]
        if still:  # never delete through a bind mount of the machine's /dev
            print(f"still mounted, {root} kept: {still}")
        elif not args.keep and not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
