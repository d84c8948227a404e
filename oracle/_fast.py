"""Launcher of the oracle's Triton engine: the attention kernel (`_fast_kernel.py`), then the merge of its key-range
splits (`_finish_kernel.py`), two launches in all.

`attention_triton(inputs, window, future_block_keys_right)` returns `(out [B, K, Hq, D], lse [B, K, Hq], figures)`:
`out` and the natural-log LSE in the precision asked (fp32 or fp64), empty rows `(0, -inf)`, the torch engine's
contract; `figures [programs, 5]` fp64, the output's statistics per program (`oracle.reference.OutputSummary` reads
them in one transfer). Extra device memory: the split partials, `splits * B * Hkv * rows * (D + 2) * 4` bytes (16 MiB
at B=32, Hkv=8, K*G=56, D=128, 2 splits; twice that in fp64); never a score matrix, never a copy of K/V.
"""

from __future__ import annotations

import math

import torch

from oracle.case import Case, pages_needed
from oracle.dtypes import TORCH_DTYPES, interpreting, page_table_int32
from oracle.inputs import Inputs, materialize

BLOCK_N = 64
MAX_BLOCK_R = 64
BLOCK_N_F64, MAX_BLOCK_R_F64 = 32, 32  # fp64 tiles: half as many keys and rows (registers)
_SM_COUNT: dict[int, int] = {}


def _pow2_at_least(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, (int(n) - 1).bit_length()))


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def plan_splits(programs: int, max_keys: int, device: torch.device, block_n: int = BLOCK_N) -> int:
    """Splits of the key range per (request, KV head, row block): enough programs for two per SM,
    at least four key tiles per split."""
    want = math.ceil(2 * _sm_count(device) / max(1, programs))
    return max(1, min(want, math.ceil(max_keys / (4 * block_n))))


def attention_triton(inputs: Inputs, window: tuple[int, int], future_block_keys_right: int | None,
                     *, splits: int | None = None, upcast: bool | None = None, kv_rounded: bool = False,
                     round_p: bool = False, precision: torch.dtype = torch.float32
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton engine's `(out, lse, figures)` in `precision` (fp32: exact products, fp32 sums; fp64: the `F64`
    variant, fp64 throughout, in smaller tiles); `kv_rounded` and `round_p` (fp32 only): the yardstick's reading and
    order."""
    from oracle import _fast_kernel as fk

    f64 = precision == torch.float64

    c = inputs.case
    B, K, Hq, Hkv, D, ps = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size
    G = c.group_size
    dev = inputs.q.device
    if upcast is None:
        upcast = interpreting()
    R = K * G
    block_n = BLOCK_N_F64 if f64 else BLOCK_N
    block_r = min(MAX_BLOCK_R_F64 if f64 else MAX_BLOCK_R, _pow2_at_least(R))
    n_rb = math.ceil(R / block_r)
    r_tot = n_rb * block_r
    d_pad = _pow2_at_least(D)
    k_pad = _pow2_at_least(K)
    n_splits = splits or plan_splits(B * Hkv * n_rb, c.max_keys, dev, block_n)

    q = inputs.q if inputs.q.stride(-1) == 1 else inputs.q.contiguous()
    kb = inputs.k_block if inputs.k_block.stride(-1) == 1 else inputs.k_block.contiguous()
    vb = inputs.v_block if inputs.v_block.stride(-1) == 1 else inputs.v_block.contiguous()
    kp, vp = inputs.k_pool, inputs.v_pool
    if kp.stride(-1) != 1 or vp.stride(-1) != 1:
        kp, vp = kp.contiguous(), vp.contiguous()
    if c.layout == "NHD":  # [pages, slot, head, D]
        kps = (kp.stride(0), kp.stride(1), kp.stride(2))
        vps = (vp.stride(0), vp.stride(1), vp.stride(2))
    else:  # HND [pages, head, slot, D]
        kps = (kp.stride(0), kp.stride(2), kp.stride(1))
        vps = (vp.stride(0), vp.stride(2), vp.stride(1))
    pt = page_table_int32(inputs.page_table)  # one pointer type, so one compiled variant
    lens = inputs.context_lens
    fp8 = TORCH_DTYPES["float8_e4m3fn"]
    is_fp8 = kp.dtype == fp8
    k_scale = float(c.k_scale) if is_fp8 else 1.0
    v_scale = float(c.v_scale) if is_fp8 else 1.0
    v_split = vp.dtype == torch.float16 or vb.dtype == torch.float16
    left, right = window
    fbk = future_block_keys_right is not None

    programs = B * Hkv
    acc_t = torch.float64 if f64 else torch.float32
    acc = torch.empty((n_splits, programs, r_tot, d_pad), dtype=acc_t, device=dev)
    m = torch.empty((n_splits, programs, r_tot), dtype=acc_t, device=dev)
    ls = torch.empty((n_splits, programs, r_tot), dtype=acc_t, device=dev)
    f64_args = {}
    if f64:  # the scales in fp64 (Python floats, exact), read by the kernel from a tensor
        f64_args = {"F64": True, "SC": _scales(dev, float(c.softmax_scale) * k_scale, v_scale, float(c.softmax_scale))}
    grid = (programs, n_rb, n_splits)
    fk.ORACLE_KERNEL[grid](
        q, kp, vp, kb, vb, pt, lens, acc, m, ls,
        q.stride(0), q.stride(1), q.stride(2),
        *kps, *vps,
        kb.stride(0), kb.stride(1), kb.stride(2),
        vb.stride(0), vb.stride(1), vb.stride(2),
        pt.stride(0), pt.stride(1),
        Hkv, n_splits, float(c.softmax_scale), k_scale, v_scale, int(left), int(right),
        int(c.block_storage == "appended"), int(fbk), int(future_block_keys_right) if fbk else -1, K, G, ps, r_tot,
        D=D, D_PAD=d_pad, BLOCK_R=block_r, BLOCK_N=block_n, K_PAD=k_pad, V_SPLIT=v_split, UPCAST=bool(upcast),
        **({"KV_ROUNDED": True} if kv_rounded and is_fp8 else {}),
        **({"ROUND_P": True} if round_p else {}),
        **f64_args,
        num_warps=4, num_stages=2,
    )
    return finish(acc, m, ls, c, block_r)


def finish(acc: torch.Tensor, m: torch.Tensor, ls: torch.Tensor, c: Case, block_r: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split partials `acc [S, B * Hkv, R_TOT, D_PAD]`, `m`, `ls [S, B * Hkv, R_TOT]` of case `c` (row blocks of
    `block_r`) merged and normalized by `oracle/_finish_kernel.py`: `(out [B, K, Hq, D], lse [B, K, Hq], figures
    [B * Hkv * row_blocks, 5])`, `out` and the natural-log `lse` in the partials' dtype, `figures` fp64 (that module's
    docstring). One launch: no combine, reorder or statistics in torch ops."""
    from oracle import _finish_kernel as fin

    B, K, Hq, Hkv, D = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim
    S, P, r_tot, d_pad = acc.shape
    n_rb = r_tot // block_r
    dev = acc.device
    out = torch.empty((B, K, Hq, D), dtype=acc.dtype, device=dev)
    lse = torch.empty((B, K, Hq), dtype=acc.dtype, device=dev)
    figures = torch.empty((P * n_rb, 5), dtype=torch.float64, device=dev)
    fin.FINISH_KERNEL[(P, n_rb)](
        acc, m, ls, out, lse, figures, S, P, r_tot, Hkv, K, c.group_size,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        D=D, D_PAD=d_pad, BLOCK_R=block_r, num_warps=4,
    )
    return out, lse, figures


BLOCK_T = 64  # the statistics kernel's key tile


def stats_triton(inputs: Inputs) -> torch.Tensor:
    """`oracle/_stats_kernel.py`'s `[B * Hkv * T_SPLITS, 5]` fp32 statistics of `inputs` (that module's docstring:
    per request, KV head and split of the owned positions, the largest query norm, pool key norm and `|v|`, block key
    norm and `|v|`, scales not applied), one launch; `oracle.precision.case_stats` reduces them on the host."""
    from oracle import _stats_kernel as sk

    c = inputs.case
    B, K, Hkv, D, G = c.batch_size, c.block_size, c.num_kv_heads, c.head_dim, c.group_size
    dev = inputs.q.device
    q, kb, vb, kp, vp = (t if t.stride(-1) == 1 else t.contiguous()
                         for t in (inputs.q, inputs.k_block, inputs.v_block, inputs.k_pool, inputs.v_pool))
    if c.layout == "NHD":
        kps, vps = (kp.stride(0), kp.stride(1), kp.stride(2)), (vp.stride(0), vp.stride(1), vp.stride(2))
    else:
        kps, vps = (kp.stride(0), kp.stride(2), kp.stride(1)), (vp.stride(0), vp.stride(2), vp.stride(1))
    appended = c.block_storage == "appended"
    most = max(c.context_lens, default=0) + (K if appended else 0)
    programs = B * Hkv
    n_t = max(1, min(math.ceil(2 * _sm_count(dev) / max(1, programs)), math.ceil(most / (4 * BLOCK_T))))
    per = math.ceil(math.ceil(max(most, 1) / n_t) / BLOCK_T) * BLOCK_T
    pt = page_table_int32(inputs.page_table)
    stats = torch.empty((programs * n_t, 5), dtype=torch.float32, device=dev)
    sk.STATS_KERNEL[(programs, n_t)](
        q, kp, vp, kb, vb, pt, inputs.context_lens, stats,
        q.stride(0), q.stride(1), q.stride(2), *kps, *vps,
        kb.stride(0), kb.stride(1), kb.stride(2), vb.stride(0), vb.stride(1), vb.stride(2),
        pt.stride(0), pt.stride(1), Hkv, int(appended), K, G, c.page_size, per,
        D=D, D_PAD=_pow2_at_least(D), BLOCK_R=min(MAX_BLOCK_R, _pow2_at_least(K * G)), BLOCK_T=BLOCK_T,
        K_PAD=_pow2_at_least(K), num_warps=4,
    )
    return stats


_SCALES: dict[tuple, torch.Tensor] = {}
_SCALES_KEPT = 256


def _scales(dev: torch.device, *values: float) -> torch.Tensor:
    """`values` as an fp64 tensor on `dev`, kept for the next case with the same scales (a sweep repeats a few): no
    host-to-device copy per launch. At most `_SCALES_KEPT` kept (the oldest dropped)."""
    key = (str(dev), values)
    t = _SCALES.get(key)
    if t is None:
        if len(_SCALES) >= _SCALES_KEPT:
            _SCALES.pop(next(iter(_SCALES)))
        t = _SCALES[key] = torch.tensor(values, dtype=torch.float64).to(dev)
    return t


_F64_READY: dict[str, bool] = {}


def f64_ready(device: torch.device) -> bool:
    """Whether this Triton compiles the kernel's `F64` variant for `device` (a compiler that fails on it, as triton 3.6
    did before the variant's conversions became inline `cvt.f64.f32`, would fail every golden reference). Asked once per
    process and device by attending a tiny case; where it cannot, the golden reference takes the torch engine in fp64
    (slower)."""
    key = str(device)
    if key not in _F64_READY:
        case = variant_cases((64,), ("bfloat16",), ("same",), 1, 1, f64=True)[0]
        try:
            inputs = materialize(case, device)
            attention_triton(inputs, case.window, None, precision=torch.float64)
            _F64_READY[key] = True
        except Exception:  # noqa: BLE001  (a compiler's failure of any kind: the torch engine then)
            _F64_READY[key] = False
    return _F64_READY[key]


def variant_cases(head_dims: tuple[int, ...], dtypes: tuple[str, ...], kv_dtypes: tuple[str, ...],
                  max_block: int, max_group: int, f64: bool = False) -> list[Case]:
    """Tiny cases (one request, one key) that launch every compiled variant of the kernel cases of these shapes
    launch: one per head dim, dtype, KV dtype (a name, or "same") and (key padding, row block) reachable with
    blocks of 1..`max_block` queries and GQA groups of 1..`max_group`. Everything else a case varies (lengths,
    pages, windows, storage, the window-B mask, strides, the page table's dtype) is a run-time argument."""
    shapes: dict[tuple[int, int], tuple[int, int]] = {}  # (K_PAD, BLOCK_R) -> the first (K, G) giving it
    most_r = MAX_BLOCK_R_F64 if f64 else MAX_BLOCK_R  # (`f64`: the `F64` variant's row blocks)
    for K in range(1, max_block + 1):
        for G in range(1, max_group + 1):
            shapes.setdefault((_pow2_at_least(K), min(most_r, _pow2_at_least(K * G))), (K, G))
    out = []
    for D in head_dims:
        for dtype in dtypes:
            for kv in dict.fromkeys(dtype if k == "same" else k for k in kv_dtypes):
                for K, G in shapes.values():
                    n = pages_needed(1, K, 16)
                    out.append(Case(context_lens=(1,), block_size=K, num_q_heads=G, num_kv_heads=1, head_dim=D,
                                    page_size=16, pages=(tuple(range(n)),), num_pages=n + 1, dtype=dtype,
                                    kv_dtype=kv, k_scale=1.0, v_scale=1.0, seed=1))
    return out
