"""The oracle at production scale on a GPU (issue: speed, item 1). Prints Markdown, writes JSON.

Shapes: Hq/Hkv = 64/8, K = 7, D = 128, bf16, page 32, NHD, block appended in the pool (so the context
lowering runs its prefill alone), B = 32, L in {8K, 32K, 128K}; plus B = 1, L = 128K, 16/2 (the split
path). Per shape:
- `triton` engine (the default on CUDA): median of 5 timed calls (CUDA events around the whole
  `attention()` call: the kernel, the split combine, the row reorder), and its extra device memory
  (peak allocated during the call minus allocated before: the case's own tensors not counted);
- `torch` engine (chunked einsum, fp32, no TF32), once, for scale, where it fits (B=32 L=128K: yes);
- agreement of the two engines (max |dO| / max |O|, max |dLSE|);
- `context[flashinfer-fa3]` on the same inputs when flashinfer imports (its `prepare()` callable when
  the adapter has one, else `run()`, which includes host planning): median of 5.
Floors: KV bytes read once over the copy ceiling, and the fp32 FLOPs over 67 TFLOP/s.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from oracle import Case, attention, materialize

COPY_TBS = 4.3   # device-to-device copy ceiling of this H200 kind, as the device tool's KINDS.md records it
FP32_TFLOPS = 67.0


def case_of(B: int, L: int, hq: int, hkv: int, K: int = 7, D: int = 128, ps: int = 32) -> Case:
    per = -(-(L + K) // ps)
    pages = tuple(tuple(range(b * per, (b + 1) * per)) for b in range(B))
    return Case(context_lens=(L,) * B, block_size=K, num_q_heads=hq, num_kv_heads=hkv, head_dim=D, page_size=ps,
                pages=pages, num_pages=B * per + 1, block_storage="appended", seed=7)


def timed(fn, reps: int = 5) -> tuple[float, list[float]]:
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), ts


def extra_memory(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del r
    return peak


def fa3_time(inputs) -> tuple[float | None, str]:
    try:
        import lowerings
        low = lowerings.get("context[flashinfer-fa3]")
        ok, why = low.available("cuda")
        if not ok:
            return None, why
        prep = getattr(low, "prepare", None)
        if callable(prep):
            fn = prep(inputs)
            how = "prepare() callable (device work only)"
        else:
            fn = lambda: low.run(inputs)  # noqa: E731
            how = "run() (includes host planning)"
        ms, _ = timed(fn)
        return ms, how
    except Exception as exc:  # report, never hide
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    dev = torch.device("cuda")
    rows = []
    shapes = [(32, 8192, 64, 8), (32, 32768, 64, 8), (32, 131072, 64, 8), (1, 131072, 16, 2)]
    for B, L, hq, hkv in shapes:
        t0 = time.perf_counter()
        case = case_of(B, L, hq, hkv)
        inputs = materialize(case, dev)
        torch.cuda.synchronize()
        build_s = time.perf_counter() - t0
        kv_bytes = 2 * B * (L + case.block_size) * hkv * case.head_dim * 2
        flops = 4 * B * hq * case.block_size * (L + case.block_size) * case.head_dim
        row = {"B": B, "L": L, "heads": f"{hq}/{hkv}", "K": case.block_size, "D": case.head_dim,
               "kv_gb": kv_bytes / 1e9, "build_s": round(build_s, 2),
               "floor_read_ms": kv_bytes / (COPY_TBS * 1e12) * 1e3, "floor_fp32_ms": flops / (FP32_TFLOPS * 1e12) * 1e3}
        fast = lambda: attention(inputs, engine="triton")  # noqa: E731
        row["triton_ms"], row["triton_all_ms"] = timed(fast)
        row["triton_extra_gb"] = extra_memory(fast) / 1e9
        ref_fast = fast()
        try:
            t1 = time.perf_counter()
            slow = attention(inputs, engine="torch")
            torch.cuda.synchronize()
            row["torch_ms_once"] = (time.perf_counter() - t1) * 1e3
            row["torch_extra_gb"] = extra_memory(lambda: attention(inputs, engine="torch")) / 1e9
            scale = slow.out.abs().max().item()
            row["engines_rel_out"] = (ref_fast.out - slow.out).abs().max().item() / scale
            fin = torch.isfinite(slow.lse)
            row["engines_abs_lse"] = (ref_fast.lse[fin] - slow.lse[fin]).abs().max().item()
            del slow
        except torch.OutOfMemoryError as exc:
            row["torch_ms_once"] = None
            row["torch_note"] = f"out of memory: {str(exc).splitlines()[0][:120]}"
        row["fa3_ms"], row["fa3_how"] = fa3_time(inputs)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del inputs, ref_fast
        torch.cuda.empty_cache()

    print()
    print("| B | L | heads | KV GB | oracle (triton) ms | extra GB | torch engine ms | torch extra GB | "
          "engines rel dO | floor read ms | fp32 floor ms | fa3 context ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        print(f"| {r['B']} | {r['L']} | {r['heads']} | {r['kv_gb']:.1f} | {r['triton_ms']:.2f} | {r['triton_extra_gb']:.3f} "
              f"| {f(r.get('torch_ms_once'), 1)} | {f(r.get('torch_extra_gb'), 3)} | {r.get('engines_rel_out', float('nan')):.1e} "
              f"| {r['floor_read_ms']:.2f} | {r['floor_fp32_ms']:.2f} | {f(r['fa3_ms'])} |")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    if out_path:
        with open(out_path, "w") as fh:
            json.dump(meta, fh, indent=1)


if __name__ == "__main__":
    main()
