"""Seconds to build one case's tensors (`oracle.inputs.materialize`), case format 2 against format 1.

    python lab/bench_materialize.py [--device cpu|cuda] [--batch 32] [--context 4096] [--kv-heads 8]
                                        [--head-dim 128] [--kv-dtype bfloat16|float8_e4m3fn] [--values plain]

Prints the best of `--repeat` builds of each format (the same shapes; format 1 draws the whole batch
from one generator, format 2 each request from streams of its own: oracle/values.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from oracle.case import VALUE_REGIMES, Case, pages_needed  # noqa: E402
from oracle.inputs import materialize  # noqa: E402


def bench_case(B: int, L: int, hkv: int, D: int, kv_dtype: str, values: str, K: int = 4, page: int = 16) -> Case:
    pages, at = [], 0
    for _ in range(B):
        n = pages_needed(L, K, page)
        pages.append(tuple(range(at, at + n)))
        at += n
    fp8 = kv_dtype == "float8_e4m3fn"
    return Case(context_lens=(L,) * B, block_size=K, num_q_heads=4 * hkv, num_kv_heads=hkv, head_dim=D,
                page_size=page, pages=tuple(pages), num_pages=at + 1, dtype="bfloat16", kv_dtype=kv_dtype,
                k_scale=2.0 if fp8 else 1.0, v_scale=0.5 if fp8 else 1.0, seed=5, values=values,
                value_keys=tuple(range(B)))


def seconds(case: Case, device: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = materialize(case, device)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
        del x
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kv-dtype", default="bfloat16", choices=("bfloat16", "float8_e4m3fn"))
    ap.add_argument("--values", default="plain", choices=VALUE_REGIMES)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    case = bench_case(a.batch, a.context, a.kv_heads, a.head_dim, a.kv_dtype, a.values)
    shape = f"B={a.batch} L={a.context} Hkv={a.kv_heads} D={a.head_dim} {a.kv_dtype} values={a.values}"
    v2 = seconds(case, a.device, a.repeat)
    v1 = seconds(case.replace(values="plain", value_keys=(), version=1), a.device, a.repeat)
    print(f"{shape} on {a.device} ({torch.get_num_threads()} threads): format 2 {v2:.2f} s, format 1 {v1:.2f} s "
          f"(best of {a.repeat})")


if __name__ == "__main__":
    main()
