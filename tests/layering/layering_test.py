#!/usr/bin/env python3
"""scripts/check-layering: the tree passes, and each kind of violation fails.

    layering_test.py SOURCE_DIR

The repository's own tree must pass. Then, on a copy of its production
folders and CMakeLists (in a temporary directory), one violation at a time is
introduced and the check must exit 1 with a message naming the file (and
line) and the modules involved; a commented-out include must not count.
"""

import os
import shutil
import subprocess
import sys
import tempfile

COPIED = ["kernels", "monitoring", "distributed", "runtime"]


def run_check(script, root):
    p = subprocess.run([sys.executable, script, "--root", root], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def append(root, path, text):
    with open(os.path.join(root, path), "a", encoding="utf-8") as f:
        f.write(text)


def replace(root, path, old, new):
    full = os.path.join(root, path)
    with open(full, encoding="utf-8") as f:
        s = f.read()
    if old not in s:
        raise AssertionError(f"{path}: test setup: '{old}' not found")
    with open(full, "w", encoding="utf-8") as f:
        f.write(s.replace(old, new, 1))


def line_count(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return sum(1 for _ in f)


# (name, mutation(root) -> None, strings every one of which the output must hold;
#  None = the check must pass)
def include_case(path, header):
    def mutate(root):
        append(root, path, f'\n#include "{header}"\n')
    return mutate


def cases(root):
    yield ("distributed includes the worker",
           include_case("distributed/communicator.cc", "runtime/worker/worker.h"),
           [f"distributed/communicator.cc:{line_count(root, 'distributed/communicator.cc') + 2}",
            "distributed must not include runtime/worker/worker.h"])
    yield ("kernels include the engine",
           include_case("kernels/types.h", "runtime/engine/engine.h"),
           ["kernels/types.h:", "kernels must not include runtime/engine/engine.h"])
    yield ("kernels' CPU backend includes the coordinator",
           include_case("kernels/cpu/cache_ops.cc", "runtime/coordinator/block_manager.h"),
           ["kernels/cpu/cache_ops.cc:", "kernels must not include runtime/coordinator"])
    yield ("the coordinator includes kernels",
           include_case("runtime/coordinator/scheduler.cc", "kernels/types.h"),
           ["runtime/coordinator/scheduler.cc:", "runtime/coordinator must not include kernels"])
    yield ("the coordinator includes the worker",
           include_case("runtime/coordinator/block_manager.h", "runtime/worker/worker.h"),
           ["runtime/coordinator must not include runtime/worker/worker.h"])
    yield ("the engine includes the worker",
           include_case("runtime/engine/engine.cc", "runtime/worker/worker.h"),
           ["runtime/engine/engine.cc:", "runtime/engine must not include runtime/worker"])
    yield ("the engine includes the launch module",
           include_case("runtime/engine/engine_loop.cc", "runtime/launch/mpi_executor.h"),
           ["runtime/engine must not include runtime/launch/mpi_executor.h"])
    yield ("distributed includes the launch module under #ifdef",
           lambda r: append(r, "distributed/liveness.cc",
                            '\n#ifdef PAGEDSERVE_WITH_CUDA\n#  include "runtime/launch/mpi_process.h"\n'
                            "#endif\n"),
           ["distributed must not include runtime/launch/mpi_process.h"])
    yield ("the worker includes the engine through a relative path",
           lambda r: append(r, "runtime/worker/worker.cc", '\n#include "../engine/executor.h"\n'),
           ["runtime/worker must not include runtime/engine/executor.h"])
    yield ("production code includes a test header",
           include_case("runtime/frontend/server.cc", "tests/common/fixture_tokenizer.h"),
           ["runtime/frontend includes tests/common/fixture_tokenizer.h"])
    yield ("the engine links the worker (no include)",
           lambda r: replace(r, "runtime/engine/CMakeLists.txt", "PRIVATE pagedserve_monitoring",
                             "PRIVATE pagedserve_worker pagedserve_monitoring"),
           ["runtime/engine/CMakeLists.txt:", "pagedserve_engine must not link pagedserve_worker"])
    yield ("an include whose module is not linked (undeclared dependency)",
           lambda r: replace(r, "runtime/engine/CMakeLists.txt", "PRIVATE pagedserve_monitoring",
                             "PRIVATE"),
           ["pagedserve_engine does not link pagedserve_monitoring",
            "runtime/engine/engine_metrics.cc:"])
    yield ("the CLI links nothing it includes",
           lambda r: replace(r, "runtime/cli/CMakeLists.txt", "pagedserve_launch pagedserve_frontend",
                             "pagedserve_frontend"),
           ["pagedserve does not link pagedserve_launch"])
    yield ("a new folder outside the layer table",
           lambda r: (os.makedirs(os.path.join(r, "runtime/newthing")),
                      append(r, "runtime/newthing/thing.cc", "int x;\n")),
           ["runtime/newthing/thing.cc: not in any module"])
    yield ("a commented-out include does not count",
           lambda r: append(r, "runtime/engine/engine.cc",
                            '\n// #include "runtime/worker/worker.h"\n'
                            '/* see runtime/worker/worker.h */\n'),
           None)
    yield ("an include of a header of the same module and of an allowed one",
           lambda r: append(r, "runtime/engine/engine.cc",
                            '\n#include "runtime/engine/executor.h"\n'
                            '#include "runtime/coordinator/scheduler.h"\n'),
           None)


def main():
    source = os.path.abspath(sys.argv[1])
    script = os.path.join(source, "scripts", "check-layering")
    failures = []

    def check(cond, what, output=""):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            failures.append(what)
            if output:
                print("      output: " + output.strip().replace("\n", "\n              "))

    rc, out = run_check(script, source)
    check(rc == 0 and "layering OK" in out, "the repository's tree passes", out)

    with tempfile.TemporaryDirectory(prefix="layering_test_") as tmp:
        pristine = os.path.join(tmp, "pristine")
        for d in COPIED:
            shutil.copytree(os.path.join(source, d), os.path.join(pristine, d))
        rc, out = run_check(script, pristine)
        check(rc == 0, "the copy of the tree passes before any change", out)
        for i, (name, mutate, expected) in enumerate(cases(pristine)):
            root = os.path.join(tmp, f"case{i}")
            shutil.copytree(pristine, root)
            mutate(root)
            rc, out = run_check(script, root)
            if expected is None:
                check(rc == 0, f"passes: {name}", out)
            else:
                missing = [e for e in expected if e not in out]
                check(rc == 1 and not missing,
                      f"caught: {name}" + (f" (missing in output: {missing})" if missing else ""),
                      out)
            shutil.rmtree(root)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
