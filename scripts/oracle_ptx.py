"""Write the PTX of one variant of the oracle's kernel (q bf16, fp8 pool, D=128, the default `KV_ROUNDED`=False
where the kernel has it), compiled for sm_90 on this machine without a GPU (`triton.compile`).

    python scripts/oracle_ptx.py OUT.ptx     # run from the root of the tree to compile

Two trees' outputs compared with their debug lines left out (`.loc`, `DW_AT_*`) say whether a change to the kernel's
source changed its instructions (docs/lab/oracle-kernel-ptx.md)."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
os.environ.pop("TRITON_INTERPRET", None)  # compiled, not interpreted (the tests' environment sets it)


def main(out: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        from oracle.reference import triton_kernel
    except ImportError:  # a tree before session 24 (the comparison's base): the kernel's module by its name
        import importlib

        fn = importlib.import_module("oracle._fast_kernel").ORACLE_KERNEL
    else:
        fn = triton_kernel()
    params = list(inspect.signature(fn.fn).parameters)
    ptr = {"Q": "*bf16", "KP": "*fp8e4nv", "VP": "*fp8e4nv", "KB": "*bf16", "VB": "*bf16", "PT": "*i32", "LENS": "*i32",
           "ACC": "*fp32", "M": "*fp32", "LS": "*fp32", "SC": "*fp64"}
    const = dict(D=128, D_PAD=128, BLOCK_R=16, BLOCK_N=64, K_PAD=16, V_SPLIT=False, UPCAST=False)
    for flag in ("KV_ROUNDED", "ROUND_P", "F64"):  # the variants a tree's kernel has, off
        if flag in params:
            const[flag] = False
    sig = {p: ptr.get(p, "constexpr" if p in const else "fp32" if p.endswith("scale") else "i32") for p in params}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 64),
                            options={"num_warps": 4, "num_stages": 2})
    Path(out).write_text(kernel.asm["ptx"])
    print(f"triton {triton.__version__}: {out}, {len(kernel.asm['ptx'].splitlines())} lines")


if __name__ == "__main__":
    main(sys.argv[1])
