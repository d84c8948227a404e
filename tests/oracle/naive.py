"""An independent, deliberately naive fp64 reference for drafter block attention (docs/semantics.md 1-3).

Written differently from `oracle/reference.py` on purpose: plain Python loops over request `b`, query
`i` and query head `h`; keys are read position by position straight from the pool through `case.pages`
(never through the page-table tensor) and the case's layout; fp8 is dequantized as
`stored.double() * scale`; the visibility rule of docs/semantics.md section 2 is written out literally;
the softmax is computed with `math` in Python floats (fp64) after subtracting the row maximum, sums
with `math.fsum`. Empty rows give `O = 0`, `LSE = -inf`.

Not a test module (no `test_` prefix): the tests import it as `naive` / `tests.oracle.naive`.
"""

from __future__ import annotations

import math

import torch

FP8 = getattr(torch, "float8_e4m3fn", None)


def _pool_as_python(pool: torch.Tensor, kv_scale: float) -> list:
    """The whole pool as nested Python float lists, dequantized (fp8: stored * scale) in fp64."""
    x = pool.detach().to("cpu").double()
    if pool.dtype == FP8:
        x = x * kv_scale
    return x.tolist()


def _read_slot(pool_list: list, layout: str, page: int, slot: int, kvh: int) -> list[float]:
    """The D-vector at (page, slot, kv head) of a pool in NHD or HND layout."""
    if layout == "NHD":
        return pool_list[page][slot][kvh]
    if layout == "HND":
        return pool_list[page][kvh][slot]
    raise ValueError(f"layout {layout!r}")


def sees(p: int, t: int, L: int, K: int, left: int, right: int) -> bool:
    """docs/semantics.md section 2, literally: query at position p sees key at position t."""
    if not (0 <= t < L + K):
        return False
    if left != -1 and not (p - left <= t):
        return False
    if right != -1 and not (t <= p + right):
        return False
    return True


def naive_attention(inputs, window=None, key_mask=None, *, with_max_score=False):
    """`(out, lse)` as fp64 CPU tensors `[B, K, Hq, D]`, `[B, K, Hq]` (natural log).

    `key_mask`: optional boolean `[B, K, Hq or 1, T]` over absolute positions `T = max_b L_b + K`.
    `with_max_score`: also return the largest |score| of any visible key (sizes fp32 rounding error).
    """
    case = inputs.case
    B, K, Hq, Hkv, D = case.batch_size, case.block_size, case.num_q_heads, case.num_kv_heads, case.head_dim
    G = Hq // Hkv
    ps = case.page_size
    left, right = case.window if window is None else window
    scale = case.head_dim ** -0.5 if case.scale is None else float(case.scale)

    k_pool = _pool_as_python(inputs.k_pool, case.k_scale)
    v_pool = _pool_as_python(inputs.v_pool, case.v_scale)
    k_blk = inputs.k_block.detach().to("cpu").double().tolist()
    v_blk = inputs.v_block.detach().to("cpu").double().tolist()
    q_all = inputs.q.detach().to("cpu").double().tolist()
    km = None
    if key_mask is not None:
        km = key_mask.detach().to("cpu").tolist()

    out = [[[[0.0] * D for _ in range(Hq)] for _ in range(K)] for _ in range(B)]
    lse = [[[-math.inf] * Hq for _ in range(K)] for _ in range(B)]
    max_score = 0.0

    for b in range(B):
        L = case.context_lens[b]
        pages_b = case.pages[b]

        def key_value(t: int, kvh: int):
            is_block = t >= L
            if is_block and case.block_storage == "dense":
                j = t - L
                return k_blk[b][j][kvh], v_blk[b][j][kvh]
            page = pages_b[t // ps]
            slot = t % ps
            return (_read_slot(k_pool, case.layout, page, slot, kvh),
                    _read_slot(v_pool, case.layout, page, slot, kvh))

        for i in range(K):
            p = L + i
            for h in range(Hq):
                kvh = h // G
                q = q_all[b][i][h]
                scores: list[float] = []
                values: list[list[float]] = []
                for t in range(L + K):
                    if not sees(p, t, L, K, left, right):
                        continue
                    if km is not None:
                        row = km[b][i]
                        if not row[h if len(row) > 1 else 0][t]:
                            continue
                    k, v = key_value(t, kvh)
                    scores.append(scale * math.fsum(q[d] * k[d] for d in range(D)))
                    values.append(v)
                if not scores:
                    continue  # empty row: O = 0, LSE = -inf
                m = max(scores)
                max_score = max(max_score, max(abs(x) for x in scores))
                w = [math.exp(s - m) for s in scores]
                z = math.fsum(w)
                lse[b][i][h] = m + math.log(z)
                out[b][i][h] = [math.fsum(w[n] * values[n][d] for n in range(len(w))) / z for d in range(D)]

    result = (torch.tensor(out, dtype=torch.float64).reshape(B, K, Hq, D),
              torch.tensor(lse, dtype=torch.float64).reshape(B, K, Hq))
    return result + (max_score,) if with_max_score else result
