"""Whether the installed Triton compiles the oracle kernel's `F64` variant for sm_90, on a machine without a GPU
(`triton.compile`): one line per KV dtype, "ok" with the PTX's line count and whether it holds an MMA, or "FAIL" and
the compiler's last words. Run from the root of a tree (docs/lab/oracle-f64-compile.md).

    python lab/oracle_f64_compile.py
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
os.environ.pop("TRITON_INTERPRET", None)  # compiled, not interpreted


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import importlib.util  # the kernel's file alone: it imports triton only (a Triton without torch will do)

    spec = importlib.util.spec_from_file_location("oracle_fast_kernel", Path.cwd() / "oracle" / "_fast_kernel.py")
    fk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fk)
    fn = fk.ORACLE_KERNEL
    params = list(inspect.signature(fn.fn).parameters)
    const = dict(D=128, D_PAD=128, BLOCK_R=32, BLOCK_N=32, K_PAD=16, V_SPLIT=False, UPCAST=False, KV_ROUNDED=False,
                 ROUND_P=False, F64=True)
    failed = 0
    for kv in ("*bf16", "*fp16", "*fp8e4nv"):
        act = "*fp16" if kv == "*fp16" else "*bf16"  # q and the dense block: q's dtype; fp8 pools beside bf16
        ptr = {"Q": act, "KP": kv, "VP": kv, "KB": act, "VB": act, "PT": "*i32", "LENS": "*i32", "ACC": "*fp64",
               "M": "*fp64", "LS": "*fp64", "SC": "*fp64"}
        sig = {p: ptr.get(p, "constexpr" if p in const else "fp32" if p.endswith("scale") else "i32") for p in params}
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": 4, "num_stages": 2})
            ptx = k.asm["ptx"]
            lines = len(ptx.splitlines())
            print(f"triton {triton.__version__} F64 pool {kv}: ok, {lines} PTX lines, mma {'mma' in ptx}")
        except Exception as err:  # noqa: BLE001  (the compiler's failure, whatever its kind)
            failed += 1
            print(f"triton {triton.__version__} F64 pool {kv}: FAIL {type(err).__name__}: {str(err)[-120:]!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
