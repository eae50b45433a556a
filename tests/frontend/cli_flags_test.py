#!/usr/bin/env python3
"""The `pagedserve` command line: help and per-sub-command flags.

    cli_flags_test.py PAGEDSERVE SOURCE_DIR [MODEL]

`--help`, `help`, `COMMAND --help`, `help COMMAND`, `--helpfull` print usage on
stdout and exit 0; each command's usage lists exactly the flags its sources
register for it (PAGEDSERVE_FLAG / PAGEDSERVE_REGISTER_FLAG in runtime/cli/);
a flag of another command, an unknown flag, a value absl's parser refuses or an
unknown command exits 2 with a message naming it, before the command runs (a
rejected flag is not ignored).
No server is needed: the commands that would run fail fast or are `sim`. With
MODEL (a model file; the CTest registration passes the default model), flag
values checked after the model is read (--gpu-memory-utilization, --dtype,
--kv-cache-dtype, --max-seq-len-to-capture, serve's --seed and
--log-stats-interval) are refused with exit 2 and a message naming the flag.
`--version` / `version` print the project's version; `--log-level` takes
debug, info, warning or error, `--log-format` text or json; `serve MODEL` takes the model as its argument
(a different --model beside it is an error); prefix caching is on by default.
With MODEL, the weight-load progress of `generate` (lines, a bar on a
terminal, JSON lines) is checked too.
"""

import glob
import json
import os
import pty
import re
import subprocess
import sys
import tempfile

COMMANDS = ["client", "generate", "serve", "sim"]


def run(binary, args, timeout=60):
    # In a scratch folder: `sim` writes its SVG into the working directory.
    with tempfile.TemporaryDirectory() as cwd:
        p = subprocess.run([binary] + args, capture_output=True, timeout=timeout, cwd=cwd)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8")


def registered_flags(source_dir):
    """{command: {dashed flag}} from the PAGEDSERVE_FLAG lines of runtime/cli/."""
    out = {c: set() for c in COMMANDS}
    pattern = re.compile(r'PAGEDSERVE_(?:FLAG\(\s*"([^"]+)",\s*[^,]+,\s*(\w+)|'
                         r'REGISTER_FLAG\(\s*"([^"]+)",\s*(\w+)\))')
    for path in glob.glob(os.path.join(source_dir, "runtime/cli/*_command.cc")) + [
            os.path.join(source_dir, "runtime/cli/common_flags.cc")]:
        with open(path, encoding="utf-8") as f:
            for m in pattern.finditer(f.read()):
                commands, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
                for c in commands.split(","):
                    out[c.strip()].add("--" + name.replace("_", "-"))
    return out


def listed_flags(usage):
    return set(re.findall(r"^  (--[a-z0-9-]+) \(default", usage, re.M))


LOAD_LINE = re.compile(r"Loading weights: ([0-9.]+) / ([0-9.]+) MiB \((\d+)%\), ([0-9.]+) s")
LOADED = re.compile(r"Loaded weights: ([0-9.]+) MiB in ([0-9.]+) s")
LOAD_BAR = re.compile(r"\rLoading weights \[[#-]{20}\] +(\d+)%  ([0-9.]+) / ([0-9.]+) MiB  ([0-9.]+) s")


def check_load_progress(binary, model, check):
    """Weight-load progress of `generate --dtype float32` (dequantized at load:
    the load takes a while): plain lines through the log when the output is not a
    terminal (a few, not one per tensor), a bar redrawn with \\r on a terminal,
    JSON objects with --log-format json; always one last line with the total."""
    gen = [binary, "generate", "--model", model, "--dtype=float32", "--prompt=hi", "--max-tokens=1",
           "--temperature=0"]
    model_mib = os.path.getsize(model) / 2**20
    p = subprocess.run(gen, capture_output=True, timeout=300, env=dict(os.environ, PAGEDSERVE_WORKER_DEVICE="cpu"))
    both = p.stdout.decode("utf-8") + p.stderr.decode("utf-8")
    lines, done = LOAD_LINE.findall(both), LOADED.findall(both)
    check(not LOAD_LINE.search(p.stdout.decode("utf-8")) and not LOADED.search(p.stdout.decode("utf-8")),
          "load progress goes to stderr: generate's stdout holds only its text")
    check(p.returncode == 0 and len(done) == 1 and 0.9 * model_mib < float(done[0][0]) <= model_mib,
          f"load progress: one 'Loaded weights' line with about the file's size ({done}, file {model_mib:.1f} MiB)")
    percents = [int(x[2]) for x in lines]
    check(len(lines) <= 4 + float(done[0][1] if done else 0) / 5 and percents == sorted(percents) and
          all(x[1] == done[0][0] for x in lines) and "\r" not in both,
          f"load progress without a terminal: a line per quarter or 5 s, no bar ({lines})")

    m, s = pty.openpty()  # stderr on a terminal, stdout on a pipe
    proc = subprocess.Popen(gen, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=s,
                            env=dict(os.environ, PAGEDSERVE_WORKER_DEVICE="cpu"))
    os.close(s)
    terminal = b""
    while True:
        try:
            data = os.read(m, 65536)
        except OSError:  # EIO: the process closed the terminal
            data = b""
        if not data:
            break
        terminal += data
    os.close(m)
    stdout = proc.stdout.read().decode("utf-8")
    proc.wait(60)
    terminal = terminal.decode("utf-8", "replace")
    bars = LOAD_BAR.findall(terminal)
    check(proc.returncode == 0 and re.search(r"\rLoaded weights: [0-9.]+ MiB in [0-9.]+ s *\r?\n", terminal) and
          all(b[2] == LOADED.search(terminal).group(1) for b in bars) and not LOAD_LINE.search(stdout),
          f"load progress on a terminal: a bar redrawn with \\r, no log lines ({len(bars)} frames, {terminal[:300]!r})")

    p = subprocess.run(gen + ["--log-format=json"], capture_output=True, timeout=300,
                       env=dict(os.environ, PAGEDSERVE_WORKER_DEVICE="cpu"))
    messages = [json.loads(line)["message"] for line in p.stderr.decode("utf-8").splitlines() if line.startswith("{")]
    check(p.returncode == 0 and sum(bool(LOADED.fullmatch(x)) for x in messages) == 1,
          f"load progress with --log-format json: JSON log lines ({messages[:6]})")


def main():
    binary, source_dir = sys.argv[1:3]
    model = sys.argv[3] if len(sys.argv) > 3 else ""
    failures = []

    def check(cond, what):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            failures.append(what)

    for args in (["--help"], ["-h"], ["help"]):
        rc, out, err = run(binary, args)
        check(rc == 0 and out.startswith("usage: pagedserve COMMAND") and
              all(f"\n  {c} " in out for c in COMMANDS), f"{args} prints the command list, exit 0 (rc={rc})")
    rc, out, err = run(binary, [])
    check(rc == 2 and "usage: pagedserve COMMAND" in err, f"no command: usage on stderr, exit 2 (rc={rc})")

    expected = registered_flags(source_dir)
    check(all(expected.values()) and "--model" in expected["serve"] and "--health" in expected["client"],
          "the sources register flags for every command")
    for c in COMMANDS:
        for args in ([c, "--help"], ["help", c], ["--help", c]):
            rc, out, err = run(binary, args)
            check(rc == 0 and out.startswith(f"usage: pagedserve {c} [flags]"),
                  f"{args}: usage of {c}, exit 0 (rc={rc}, stderr={err.strip()[:200]!r})")
            listed = listed_flags(out)
            check(listed == expected[c], f"{args} lists exactly {c}'s flags "
                  f"(missing {sorted(expected[c] - listed)}, extra {sorted(listed - expected[c])})")
    rc, out, err = run(binary, ["--helpfull"])
    check(rc == 0 and all(f"usage: pagedserve {c} [flags]" in out for c in COMMANDS),
          f"--helpfull prints every command's usage, exit 0 (rc={rc})")
    check(listed_flags(out) == set().union(*expected.values()), "--helpfull lists every flag")

    # A flag of another command: exit 2 naming it, before the command runs.
    # `sim` alone succeeds, and `client --health` on a dead endpoint would wait
    # for a timeout: neither happens.
    not_applicable = [
        (["sim", "--block-size", "8"], "--block-size"),
        (["sim", "--model=/x.gguf"], "--model"),
        (["sim", "--no-enable-prefix-caching"], "--enable-prefix-caching"),
        (["client", "--health", "--max-num-seqs", "4", "--zmq-endpoint", "tcp://127.0.0.1:9"],
         "--max-num-seqs"),
        (["serve", "--model", "/x.gguf", "--max-tokens", "4"], "--max-tokens"),
        (["serve", "--model", "/x.gguf", "--health"], "--health"),
        (["generate", "--model", "/x.gguf", "--metrics-port", "9400"], "--metrics-port"),
        (["generate", "--model", "/x.gguf", "--sim_seed=3"], "--sim-seed"),
        (["--zmq-endpoint", "tcp://127.0.0.1:9", "sim"], "--zmq-endpoint"),
    ]
    for args, flag in not_applicable:
        command = next(a for a in args if a in COMMANDS)
        rc, out, err = run(binary, args, timeout=20)
        check(rc == 2 and f"{flag} does not apply to `pagedserve {command}`" in err and out == "",
              f"{args}: exit 2 naming {flag} (rc={rc}, stderr={err.strip()!r})")

    for args, what in ((["sim", "--bogus-flag"], "unknown flag --bogus-flag"),
                       # Values absl's parser refuses: exit 2 too, the flag named.
                       (["sim", "--sim-num-requests=abc"], "invalid value 'abc' for --sim-num-requests"),
                       (["sim", "--sim-num-requests", "1.5"], "invalid value '1.5' for --sim-num-requests"),
                       (["sim", "--sim-num-requests"], "missing value for --sim-num-requests"),
                       (["generate", "--enable-prefix-caching=maybe"],
                        "invalid value 'maybe' for --enable-prefix-caching"),
                       (["generate", "--no-enable-prefix-caching=true"],
                        "the negation of --enable-prefix-caching takes no value"),
                       (["frob"], "unknown command 'frob'"),
                       (["frob", "--help"], "unknown command 'frob'")):
        rc, out, err = run(binary, args)
        check(rc == 2 and what in err, f"{args}: exit 2, '{what}' (rc={rc}, stderr={err.strip()[:200]!r})")

    # absl's --flagfile still works (its directives are left to absl).
    with tempfile.NamedTemporaryFile("w", suffix=".flags") as ff:
        ff.write("--sim_num_requests=3\n")
        ff.flush()
        rc, out, err = run(binary, ["sim", f"--flagfile={ff.name}"])
        check(rc == 0, f"--flagfile with a valid flag runs (rc={rc}, {err.strip()[-200:]!r})")

    # Accepted forms: the command runs. A non-boolean flag's separate value is
    # not taken for the command (`--sim-seed 3 sim`); dashed negation works.
    rc, out, err = run(binary, ["--sim-seed", "3", "sim", "--sim-num-requests", "5"])
    check(rc == 0 and "paged" in out.lower(), f"flag before the command, its value skipped (rc={rc}, {err!r})")
    rc, out, err = run(binary, ["sim", "--sim_num_requests=5", "--sim-block-size=8"])
    check(rc == 0, f"underscored and dashed spellings (rc={rc}, {err!r})")
    rc, out, err = run(binary, ["generate", "--no-enable-prefix-caching", "--model", "/nonexistent.gguf"])
    check(rc == 1 and "does not exist" in err and "nknown" not in err,
          f"--no-enable-prefix-caching parses; the missing model is the error (rc={rc}, {err.strip()!r})")

    # `serve` serves ZeroMQ and HTTP: its summary says both.
    rc, out, err = run(binary, ["serve", "--help"])
    summary = out.split("\n")[2] if out.count("\n") > 2 else ""
    check("ZeroMQ" in summary and "HTTP" in summary, f"serve's summary names ZeroMQ and HTTP ({summary!r})")
    rc, out, err = run(binary, ["generate", "--log-color=sometimes", "--model", "/nonexistent.gguf"])
    check(rc == 2 and "--log-color must be auto, always or never" in err,
          f"--log-color=sometimes: exit 2 naming the values (rc={rc}, {err.strip()!r})")
    for mode in ("auto", "always", "never"):
        rc, out, err = run(binary, ["generate", f"--log-color={mode}", "--model", "/nonexistent.gguf"])
        check(rc == 1 and "does not exist" in err, f"--log-color={mode} parses (rc={rc}, {err.strip()!r})")

    # --log-level: spdlog's levels by their usual names; another value exits 2 naming them.
    rc, out, err = run(binary, ["generate", "--log-level=verbose", "--model", "/nonexistent.gguf"])
    check(rc == 2 and "--log-level must be debug, info, warning or error, got 'verbose'" in err,
          f"--log-level=verbose: exit 2 naming the values (rc={rc}, {err.strip()!r})")
    for level in ("debug", "info", "warning", "error", "WARNING"):
        rc, out, err = run(binary, ["serve", f"--log-level={level}", "/nonexistent.gguf"])
        check(rc == 1 and "does not exist" in err, f"--log-level={level} parses (rc={rc}, {err.strip()!r})")

    rc, out, err = run(binary, ["serve", "--log-format=xml", "/nonexistent.gguf"])
    check(rc == 2 and "--log-format must be text or json, got 'xml'" in err,
          f"--log-format=xml: exit 2 naming the formats (rc={rc}, {err.strip()!r})")
    for fmt in ("text", "json"):
        rc, out, err = run(binary, ["generate", f"--log-format={fmt}", "--model", "/nonexistent.gguf"])
        check(rc == 1 and "does not exist" in err, f"--log-format={fmt} parses (rc={rc}, {err.strip()!r})")

    # --version / version: the project's version alone on stdout, exit 0.
    with open(os.path.join(source_dir, "CMakeLists.txt"), encoding="utf-8") as f:
        version = re.search(r"project\(pagedserve VERSION ([0-9.]+)", f.read()).group(1)
    for args in (["--version"], ["version"], ["serve", "--version"]):
        rc, out, err = run(binary, args)
        check(rc == 0 and out == version + "\n" and err == "",
              f"{args}: prints {version}, exit 0 (rc={rc}, out={out!r}, err={err.strip()!r})")

    # Prefix caching is on by default (as vLLM V1): the usage says so.
    rc, out, err = run(binary, ["serve", "--help"])
    check("--enable-prefix-caching (default true)" in out, "serve --help: prefix caching on by default")

    # `serve MODEL` as `vllm serve MODEL`: the argument is --model; both given
    # and different, or two arguments, exit 2 naming them.
    rc, out, err = run(binary, ["serve", "/nonexistent-positional.gguf", "--port=-1"])
    check(rc == 1 and "--model: '/nonexistent-positional.gguf' does not exist" in err,
          f"serve MODEL: the argument is the model (rc={rc}, {err.strip()!r})")
    rc, out, err = run(binary, ["serve", "/same.gguf", "--model=/same.gguf"])
    check(rc == 1 and "'/same.gguf' does not exist" in err,
          f"serve MODEL --model MODEL (the same): accepted (rc={rc}, {err.strip()!r})")
    rc, out, err = run(binary, ["serve", "/a.gguf", "--model", "/b.gguf"])
    check(rc == 2 and "the model is given twice" in err and "'/a.gguf'" in err and "'/b.gguf'" in err,
          f"serve A --model B: exit 2 naming both (rc={rc}, {err.strip()!r})")
    rc, out, err = run(binary, ["serve", "/a.gguf", "/b.gguf"])
    check(rc == 2 and "unexpected argument '/b.gguf'" in err,
          f"serve A B: exit 2 naming the extra argument (rc={rc}, {err.strip()!r})")

    # Values checked once the model is read: exit 2, the flag and the rule named.
    if model:
        for flags, rule in ((["--seed=-2"], "--seed must be >= 0 (or -1 for none), got -2"),
                            (["--log-stats-interval=0"], "--log-stats-interval must be in [0.01, 86400]"),
                            (["--log-stats-interval=1e-9"], "--log-stats-interval must be in [0.01, 86400]")):
            rc, out, err = run(binary, ["serve", model, "--port=-1"] + flags)
            check(rc == 2 and rule in err, f"serve {flags}: exit 2, '{rule}' (rc={rc}, {err.strip()[-200:]!r})")
        for flag, value, rule in (("--gpu-memory-utilization", "0", "must be in (0, 1]"),
                                  ("--gpu-memory-utilization", "1.5", "must be in (0, 1]"),
                                  ("--gpu-memory-utilization", "nan", "must be in (0, 1]"),
                                  ("--kv-cache-dtype", "fp9", "must be auto, float32"),
                                  ("--max-seq-len-to-capture", "0", "must be >= 1"),
                                  ("--dtype", "int4", "--dtype")):
            rc, out, err = run(binary, ["generate", "--model", model, f"{flag}={value}", "--prompt=hi"])
            check(rc == 2 and rule in err and (flag in err), f"{flag}={value}: exit 2, '{rule}' (rc={rc}, {err.strip()[-200:]!r})")
        # CUDA-only flags on a CPU worker: accepted, with a warning naming them.
        with tempfile.TemporaryDirectory() as cwd:
            p = subprocess.run([binary, "generate", "--model", model, "--prompt=hi", "--max-tokens=1",
                                "--enforce-eager", "--gpu-memory-utilization=0.5"],
                               capture_output=True, timeout=120, cwd=cwd,
                               env=dict(os.environ, PAGEDSERVE_WORKER_DEVICE="cpu"))
        both = p.stdout.decode("utf-8") + p.stderr.decode("utf-8")
        check(p.returncode == 0 and
              "--gpu-memory-utilization, --enforce-eager only apply to CUDA workers" in both,
              f"CUDA-only flags on the CPU: run, with a warning (rc={p.returncode}, {both[-300:]!r})")
        check_load_progress(binary, model, check)
    else:
        print("note: no MODEL argument, flag values checked after the model is read are not tested")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
