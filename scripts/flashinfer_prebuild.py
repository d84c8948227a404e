"""Compile flashinfer's JIT modules for a GPU runner on a machine without a GPU (nvcc and the CUDA headers
needed, no driver), so that the GPU's minutes are not spent compiling them.

    FLASHINFER_CUDA_ARCH_LIST=9.0a python scripts/flashinfer_prebuild.py [--only PREFIX] [--head-dims 64,128] [--jobs N]
    python flashinfer_aot.py pack fi_aot.tar.xz      # then, on the runner: flashinfer_aot.py install ...

It builds what the project's flashinfer adapters load under the `gpu` profile's limits (flashinfer 0.7.x):
the page (append) and cascade (merge_state) modules; per head dim, query dtype (bf16, fp16) and KV dtype
(the query's, fp8 e4m3): the batch decode module and the fa2 paged-prefill module, each with and without
a sliding window (the windowed merges' decode rows take one: without them in a pack, each process of a
sweep compiles them, or waits on another's compile, at the merges' warm-up);
per head dim and query dtype: the fa3 module with and without a window (fa3 has no fp8-KV kernel for
bf16/fp16 queries). Each module is one line: its name and the seconds it took, or why it failed;
exit 1 if one failed. A module already in flashinfer's JIT cache takes no time; one installed from a pack
(flashinfer_aot.py install) is not rebuilt.

Linking needs `libcuda.so`, which a machine without the driver lacks: when the linker cannot find one, a stub
(an empty shared library with the driver's soname, `libcuda.so.1`) is made in a temporary directory and put
on `LIBRARY_PATH`; the modules load the real driver on the GPU machine. Measured on a 2-core machine (busy
with other work, 2026-12-01): page 105 s, cascade 34 s, decode 17-59 s, fa2 78-214 s per module
(docs/gpu/runs/23-prebuild-cpu.log); installed on the H200, the flashinfer GPU tests over them passed
(docs/gpu/2026-12-01-h200-session7.md). The fa3 modules need cuRAND's headers (cutlass
includes `curand_kernel.h`): without them in the toolkit, `pip install nvidia-curand` and they are found;
a fa3 module took 350-519 s on the same 2-core machine (922 s beside other work): all 34 modules in about
96 minutes, part of it beside other work (docs/gpu/2026-12-02-h200-session8.md). The 34 page, cascade,
decode and fa2 modules, windowed decode included, `--jobs 2` on the idle 2-core machine: 1,491 s (page 39 s,
cascade 18 s, decode 33-41 s, fa2 128-159 s; docs/gpu/runs/35-prebuild-cpu.log).
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _ensure_libcuda() -> None:
    """A stub libcuda.so on LIBRARY_PATH when the linker would find none (see the module docstring)."""
    cuda_lib = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64"
    paths = [p for p in os.environ.get("LIBRARY_PATH", "").split(":") if p] + [str(cuda_lib), str(cuda_lib / "stubs")]
    if ctypes.util.find_library("cuda") or any((Path(p) / "libcuda.so").exists() for p in paths):
        os.environ["LIBRARY_PATH"] = ":".join(paths)
        return
    stub = Path(tempfile.mkdtemp(prefix="cudastub-"))
    (stub / "s.c").write_text("void dflash_parity_libcuda_stub(void) {}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so"),
                    str(stub / "s.c")], check=True)
    os.environ["LIBRARY_PATH"] = ":".join([str(stub), *paths])
    print(f"no libcuda.so to link against: using a stub in {stub}", flush=True)


def _ensure_curand_headers() -> None:
    """fa3's sources include cutlass's `curand_kernel.h`; a CUDA toolkit without cuRAND lacks it. Add the
    include directory of the `nvidia-curand` wheel (`pip install nvidia-curand`) to CPATH when it is
    installed; otherwise say once that the fa3 modules will fail to build, and why."""
    cuda_inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if (cuda_inc / "curand_kernel.h").exists():
        return
    try:
        import nvidia  # namespace package of NVIDIA's wheels
        found = [p for root in nvidia.__path__ for p in Path(root).glob("*/include") if (p / "curand_kernel.h").exists()]
    except ImportError:
        found = []
    if found:
        os.environ["CPATH"] = ":".join([str(found[0]), *filter(None, [os.environ.get("CPATH")])])
        print(f"curand_kernel.h from {found[0]} (CPATH)", flush=True)
    else:
        print(f"no curand_kernel.h in {cuda_inc}: the fa3 modules will not build (pip install nvidia-curand)", flush=True)


def specs(head_dims: tuple[int, ...]):
    """(label, flashinfer JitSpec) for every module the adapters load under the `gpu` profile."""
    import torch
    from flashinfer import prefill
    from flashinfer.jit.attention import modules as M
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.page import gen_page_module

    fp8, i32 = torch.float8_e4m3fn, torch.int32
    out = [("page", gen_page_module()), ("cascade", gen_cascade_module())]
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", fp8: "fp8"}
    for D in head_dims:
        for q in (torch.bfloat16, torch.float16):
            for kv in (q, fp8):
                dt = short[q] + ("" if kv == q else "/" + short[kv])
                for win in (False, True):  # windowed: the windowed merges' part A (decode rows with window_left)
                    out.append((f"decode {dt} D={D}" + (" window" if win else ""),
                                M.gen_batch_decode_module(q, kv, q, i32, D, D, 0, win, False)))
                for win in (False, True):
                    out.append((f"fa2 {dt} D={D} {'window' if win else 'no-window'}",
                                prefill._gen_batch_prefill_primary_module("fa2", q, kv, q, i32, D, D, 0, win, False, False)))
    for D in head_dims:
        for q in (torch.bfloat16, torch.float16):
            for win in (False, True):
                out.append((f"fa3 {short[q]} D={D} {'window' if win else 'no-window'}",
                            M.gen_batch_prefill_module("fa3", q, q, q, i32, D, D, 0, win, False, False)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX",
                    help="build only the modules whose label starts with PREFIX (repeatable: 'fa2', 'decode bf16', ...)")
    ap.add_argument("--head-dims", default="128,64", metavar="D[,D...]", help="head dims (default 128,64)")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="modules built side by side (default 1; ninja's own parallelism inside each: MAX_JOBS)")
    ap.add_argument("--list", action="store_true", help="print the labels and exit")
    args = ap.parse_args(argv)
    try:
        dims = tuple(int(x) for x in args.head_dims.split(","))
    except ValueError:
        ap.error(f"--head-dims: comma-separated integers, got {args.head_dims!r}")
    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        ap.error("set FLASHINFER_CUDA_ARCH_LIST to the runner's architecture (9.0a for Hopper): there is no GPU to ask")
    todo = [(label, s) for label, s in specs(dims) if not args.only or any(label.startswith(p) for p in args.only)]
    if args.list:
        print("\n".join(label for label, _ in todo))
        return 0
    if args.jobs < 1:
        ap.error(f"--jobs: a positive number of modules built side by side, got {args.jobs}")
    if args.jobs > 1 and not os.environ.get("MAX_JOBS"):
        # ninja's default is every core for each module: N modules side by side would start N times that many
        # nvcc processes (fa3's take gigabytes each). Share the cores instead. A GPU machine that ran 8 fa3
        # builds with ninja's default beside 14 pytest workers stopped answering (docs/gpu/2026-12-02-h200-session8.md).
        os.environ["MAX_JOBS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    _ensure_libcuda()
    _ensure_curand_headers()
    t_all = time.time()

    def build(item) -> bool:
        label, spec = item
        if getattr(spec, "is_aot", False):  # installed from a pack (flashinfer_aot.py install): nothing to build
            print(f"{label}: installed already (AOT), not rebuilt", flush=True)
            return True
        t0 = time.time()
        try:
            spec.build(verbose=False)
            print(f"{label}: built in {time.time() - t0:.0f} s", flush=True)
            return True
        except Exception as err:  # one module's failure never stops the others
            print(f"{label}: FAILED after {time.time() - t0:.0f} s: {type(err).__name__}: {str(err)[:300]}", flush=True)
            return False

    # Each build is a ninja subprocess: threads are enough to run several side by side.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        failed = sum(not ok for ok in pool.map(build, todo))
    print(f"{len(todo) - failed} of {len(todo)} module(s) built in {time.time() - t_all:.0f} s"
          + (f", {failed} FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
