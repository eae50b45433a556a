#!/usr/bin/env python3
"""llama-cpp-python's OpenAI-compatible server (`python3 -m llama_cpp.server`)
with llama.cpp's extra buffer types turned off, for bench/serving_bench.py.

    python3 bench/llamacpp_server.py --model GGUF --n_threads 2 --port 8000 ...

Every argument goes to llama_cpp.server unchanged. The only difference: model
loading sets llama_model_params.use_extra_bufts = false (as
bench/llamacpp_baseline.py does), because the extra CPU buffer types (AMX tiles,
repacked weights) of the prebuilt llama.cpp fault with "Illegal instruction" on
this virtualised Xeon, and Q4_1 has no repacked kernel anyway. The server
exposes no flag for it, so the default-params constructor is wrapped.
"""
import runpy
import sys

import llama_cpp.llama_cpp as C

_default_params = C.llama_model_default_params


def _params_without_extra_bufts():
    params = _default_params()
    params.use_extra_bufts = False
    return params


C.llama_model_default_params = _params_without_extra_bufts

if __name__ == "__main__":
    sys.argv[0] = "llama_cpp.server"
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
