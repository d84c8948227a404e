"""Whether the installed Triton compiles the oracle's statistics and split-merge kernels (oracle/_stats_kernel.py,
oracle/_finish_kernel.py) for sm_90 without a GPU (`triton.compile`), every dtype pair and tile the launchers use: one
line each, "ok" with the PTX line count or "FAIL". Run from the root of a tree (docs/lab/oracle-f64-compile.md).

    python lab/oracle_kernels_compile.py
"""

import importlib.util
import inspect
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
def load(name, file):
    spec = importlib.util.spec_from_file_location(name, Path.cwd() / "oracle" / file)
    m = importlib.util.module_from_spec(spec); sys.modules[name]=m; spec.loader.exec_module(m); return m
fin = load("oracle_finish_kernel", "_finish_kernel.py")
sk = load("oracle_stats_kernel", "_stats_kernel.py")
bad = 0
for acc in ("*fp32", "*fp64"):
    for D, BR in ((64, 16), (128, 32), (128, 64)):
        fn = fin.FINISH_KERNEL
        params = list(inspect.signature(fn.fn).parameters)
        const = dict(D=D, D_PAD=D, BLOCK_R=BR)
        ptr = {"ACC": acc, "M": acc, "LS": acc, "OUT": acc, "LSE": acc, "FIG": "*fp64"}
        sig = {p: ptr.get(p, "constexpr" if p in const else "i32") for p in params}
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            print("finish", acc, D, BR, "ok", len(k.asm["ptx"].splitlines()))
        except Exception as e:
            bad += 1; print("finish", acc, D, BR, "FAIL", type(e).__name__, str(e)[-300:])
for q, kv in (("*bf16", "*bf16"), ("*fp16", "*fp16"), ("*bf16", "*fp8e4nv"), ("*fp16", "*fp8e4nv")):
    fn = sk.STATS_KERNEL
    params = list(inspect.signature(fn.fn).parameters)
    const = dict(D=128, D_PAD=128, BLOCK_R=32, BLOCK_T=64, K_PAD=16)
    ptr = {"Q": q, "KP": kv, "VP": kv, "KB": q, "VB": q, "PT": "*i32", "LENS": "*i32", "STATS": "*fp32"}
    sig = {p: ptr.get(p, "constexpr" if p in const else "i32") for p in params}
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        print("stats", q, kv, "ok", len(k.asm["ptx"].splitlines()))
    except Exception as e:
        bad += 1; print("stats", q, kv, "FAIL", type(e).__name__, str(e)[-300:])
print("triton", triton.__version__, "failed", bad)
sys.exit(1 if bad else 0)
