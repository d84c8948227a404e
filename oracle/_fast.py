"""Launcher of the oracle's Triton engine (`_fast_kernel.py`) and the fp32 combine of its splits.

`attention_triton(inputs, window, future_block_keys_right)` returns `(out [B, K, Hq, D], lse [B, K, Hq])`
in fp32, natural-log LSE, empty rows `(0, -inf)`: the torch engine's contract. Extra device memory:
the split partials, `splits * B * Hkv * rows * (D + 2) * 4` bytes (16 MiB at B=32, Hkv=8, K*G=56, D=128,
2 splits), and the combine's temporaries of the same order; never a score matrix, never a copy of K/V.
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
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton engine's `(out, lse)` in `precision` (fp32: exact products, fp32 sums; fp64: the `F64` variant,
    fp64 throughout, in smaller tiles); `kv_rounded` and `round_p` (fp32 only): the yardstick's reading and order."""
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
        sc = torch.tensor([float(c.softmax_scale) * k_scale, v_scale, float(c.softmax_scale)], dtype=torch.float64)
        f64_args = {"F64": True, "SC": sc.to(dev, non_blocking=True)}
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
    out, lse = combine_splits(acc, m, ls)
    out = out.view(B, Hkv, r_tot, d_pad)[:, :, :R, :D].reshape(B, Hkv, K, G, D)
    out = out.permute(0, 2, 1, 3, 4).reshape(B, K, Hq, D)
    lse = lse.view(B, Hkv, r_tot)[:, :, :R].reshape(B, Hkv, K, G).permute(0, 2, 1, 3).reshape(B, K, Hq)
    return out, lse


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


def combine_splits(acc: torch.Tensor, m: torch.Tensor, ls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split partials in fp32: `acc [S, P, R, D]` (unnormalized), running max `m` and sum `ls`
    `[S, P, R]` -> `out [P, R, D]`, natural-log `lse [P, R]`; rows no split saw give `(0, -inf)`."""
    if acc.shape[0] == 1:
        mm, l, a = m[0], ls[0], acc[0]
    else:
        mmax = m.amax(0)
        safe = torch.where(torch.isinf(mmax), torch.zeros_like(mmax), mmax)
        w = torch.exp(m - safe)  # exp(-inf) = 0 for empty splits
        l = (w * ls).sum(0)
        a = (w.unsqueeze(-1) * acc).sum(0)
        mm = mmax
    has = l > 0
    one = torch.ones_like(l)
    out = torch.where(has.unsqueeze(-1), a / torch.where(has, l, one).unsqueeze(-1), torch.zeros_like(a))
    lse = torch.where(has, mm + torch.log(torch.where(has, l, one)), torch.full_like(l, float("-inf")))
    return out, lse
