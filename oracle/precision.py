"""How wrong the oracle itself may be on a case: an a-priori bound on its error, per precision and engine.

The judge keeps the reference's own error at most `GOLDEN_SHARE` (1/10) of the tightest bound it applies
(`parity.engine.golden`); this module says how large that error can be, from the case's values and the engine's
arithmetic, before or after the attention is computed. Nothing here runs a lowering.

Statistics of a case (`case_stats`, computed in fp64 from the tensors exactly as the oracle reads them):
`A`, the largest `scale * max_i |q_i|_2 * max_t |k_t|_2` over (request, KV head) pairs, which bounds both
`|s|` and `scale * sum_d |q_d k_d|` for every score of that pair (Cauchy-Schwarz); `V = max |v|` over the keys
a request owns; `n`, the most keys a query row can see (`max_b L_b + K`); the head dim `D`.

The bound, with `u` the unit roundoff of the precision (2^-24 fp32, 2^-53 fp64):

- scores: `ds = c_dot * u * A`. The torch engine rounds each product (fp8 keys carry their scale, 24 bits)
  and sums D of them in any order: `c_dot = D + 2` (worst case, every order; the `+ 2`: the product and
  the scale's multiplication). The Triton engine's tensor cores multiply exactly and accumulate with
  truncation, whose error is up to one fp32 ulp (2u) per addition: `c_dot = 2 D + 3`.
- weights: `exp(s - m)` within `EXP_ULPS` ulps; the argument's rounding `u |s_j - m|` weighs `p_j`, and
  `sum_j p_j (m - s_j) <= ln n` (the entropy of a row), so it costs `2 u (ln n + 1)` of the row's weight.
  A relative change `r_j` of each weight, `|r_j| <= rho`, moves `p` by `sum_j |p'_j - p_j| <= e^(2 rho) - 1`
  and `O = sum_j p_j v_j` by that much times `max_j |v_j - O| <= 2 V`; exact, not first order, so it holds
  at huge scores too.
- sums over keys (`n` weights and `n` weighted values): `gamma(m) = min(m, LAMBDA sqrt(m)) u` for sums
  rounded to nearest (the probabilistic bound of Higham and Mary, 2019: it fails with probability below
  `2 m exp(-LAMBDA^2 / 2)`, under 1e-19 for LAMBDA = 10 and m up to 2^20), the worst case `m u` where
  that is smaller; the Triton engine's `p @ v` runs `P_V_TERMS` chained tensor-core dots per tile of
  `BLOCK_N` keys, each addition truncating (worst case `2 u` each), then rounds to nearest across tiles.

So `out_abs = 2 V (e^(2 (ds + EXP_ULPS u)) - 1 + 2 u (ln n + 1)) + V (gamma_acc + gamma_l + 4 u)` bounds
`max |O - O_exact|`, and `lse_abs(row) = ds + (EXP_ULPS + 2) u + gamma_l + 3 u ln n + u |LSE_row|` the
natural-log LSE's error. In fp64 both are below 1e-9 of the case's scale: the golden reference.
`scripts/oracle_error.py` prints the measured error against an independent fp64 reference next to these
bounds (a bound below a measured error is a defect: `tests/oracle/test_precision.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from oracle.dtypes import TORCH_DTYPES
from oracle.errors import InvalidInput
from oracle.inputs import Inputs
from oracle.reference import triton_engine_ready

GOLDEN_SHARE = 0.1  # the oracle's error may be at most this share of the tightest bound the judge applies
LAMBDA = 10.0  # the probabilistic sum bound's confidence (module docstring)
EXP_ULPS = 4.0  # exp/exp2 (with the product by log2 e) within this many units of roundoff, every engine
BLOCK_N = 64  # the Triton engine's key tile (oracle/_fast.py)
P_V_TERMS = 5  # chained tensor-core dots per tile in its p @ v (three bf16 terms of p, two of v)
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}
ENGINES = ("torch", "triton")
STATS_ELEMENTS = 1 << 24  # pool elements reduced at a time (64 MiB in fp32)
STATS_MARGIN = 1.001  # fp32 reductions of at most 2^10 squares: well within 0.1% of the exact norm


@dataclass(frozen=True)
class CaseStats:
    """What the bound reads of a case: `A` (score scale), `V` (max |v|), `n` (keys a row may see), `D`."""

    A: float
    V: float
    n: int
    D: int

    def to_json(self) -> dict:
        return {"A": self.A, "V": self.V, "n": self.n, "D": self.D}


@dataclass(frozen=True)
class ErrorBound:
    """The oracle's error on a case in one precision and engine: `out_abs`, absolute, in output units (of
    `max |O - O_exact|`); `lse_const` and `lse_rel`: `|LSE - LSE_exact| <= lse_const + lse_rel |LSE|` per
    row, natural log; `score_abs`, the bound on each score's error it was built from."""

    precision: str
    engine: str
    out_abs: float
    lse_const: float
    lse_rel: float
    score_abs: float

    def lse_abs(self, lse: float) -> float:
        return self.lse_const + self.lse_rel * abs(lse)


def _gamma_rn(m: int, u: float) -> float:
    """Error factor of a sum of `m` terms rounded to nearest: worst case or probabilistic, the smaller."""
    m = max(int(m), 1)
    return min(m, LAMBDA * math.sqrt(m)) * u * 1.01


def bound(stats: CaseStats, precision: torch.dtype = torch.float32, engine: str = "torch") -> ErrorBound:
    """The oracle's error bound on a case with `stats` (module docstring), for `precision` (torch.float32 or
    torch.float64) and `engine` ("torch" or "triton": the compiled kernel; the interpreted one rounds as torch)."""
    if precision not in UNIT_ROUNDOFF:
        raise InvalidInput("precision", f"torch.float32 or torch.float64, got {precision}")
    if engine not in ENGINES:
        raise InvalidInput("engine", f"one of {ENGINES}, got {engine!r}")
    u = UNIT_ROUNDOFF[precision]
    n, D = max(stats.n, 1), max(stats.D, 1)
    ln_n = math.log(n)
    if engine == "triton":  # fp64 too: its dots' accumulation order is the compiler's, so the worst case
        c_dot = 2 * D + 3
        tile = min(n, BLOCK_N)
        gamma_acc = 2 * u * P_V_TERMS * tile + _gamma_rn(math.ceil(n / BLOCK_N) + 2, u)
        gamma_l = _gamma_rn(tile, u) + _gamma_rn(math.ceil(n / BLOCK_N) + 2, u)
    else:
        c_dot = D + 2
        gamma_acc = gamma_l = _gamma_rn(n + math.ceil(n / 2048) + 2, u)
    ds = c_dot * u * stats.A * 1.01
    rho = ds + EXP_ULPS * u
    grow = math.expm1(2 * rho) if rho < 300 else math.inf  # past that no output is bounded (and exp overflows)
    out_abs = 2 * stats.V * (grow + 2 * u * (ln_n + 1)) + stats.V * (gamma_acc + gamma_l + 4 * u)
    lse_const = ds + (EXP_ULPS + 2) * u + gamma_l + 3 * u * ln_n
    name = {torch.float32: "float32", torch.float64: "float64"}[precision]
    return ErrorBound(name, engine, out_abs, lse_const, 2 * u, ds)


def case_stats(inputs: Inputs, engine: str = "auto") -> CaseStats:
    """`CaseStats` of `inputs` (module docstring): per-slot norms and max |v| of the pool, read through the page table
    (never a canary slot: only keys a request owns), and of the dense block. Reductions in fp32 over the stored
    values (scales applied after), each rounded up by `STATS_MARGIN`. `engine`: "torch" (torch ops), "triton" (one
    launch of `oracle/_stats_kernel.py`: CUDA tensors, or CPU ones under the interpreter), "auto" (Triton on CUDA where
    it runs, else torch)."""
    return pending_case_stats(inputs, engine)()


def pending_case_stats(inputs: Inputs, engine: str = "auto") -> Callable[[], CaseStats]:
    """`case_stats(inputs, engine)` in two steps: the device reductions start now, the returned function reads them
    (one host transfer, waiting for the device) and reduces the per-program figures on the host. The torch engine
    computes everything when the function is called."""
    if engine not in ("auto", *ENGINES):
        raise InvalidInput("engine", f"one of ('auto', 'torch', 'triton'), got {engine!r}")
    if engine == "auto":
        engine = "triton" if inputs.q.device.type == "cuda" and triton_engine_ready(inputs.q.device) else "torch"
    if engine == "torch":
        return lambda: _case_stats_torch(inputs)
    if not triton_engine_ready(inputs.q.device):
        raise InvalidInput("engine", f"'torch' or 'auto' for tensors on {inputs.q.device}: the Triton engine needs "
                           "triton and CUDA tensors (or TRITON_INTERPRET=1 for CPU ones)")
    from oracle._fast import stats_triton

    peaks = stats_triton(inputs)
    return lambda: _from_peaks(inputs, peaks.tolist())


def _scales_of(inputs: Inputs) -> tuple[float, float]:
    """`(|k_scale|, |v_scale|)` where the pool is fp8 (the stored values are scaled when read), else `(1, 1)`."""
    c = inputs.case
    if inputs.k_pool.dtype == TORCH_DTYPES["float8_e4m3fn"]:
        return abs(c.k_scale), abs(c.v_scale)
    return 1.0, 1.0


def _finished(inputs: Inputs, A: float, V: float) -> CaseStats:
    c = inputs.case
    A, V = A * STATS_MARGIN, V * STATS_MARGIN
    if not (math.isfinite(A) and math.isfinite(V)):
        A, V = math.inf, math.inf
    return CaseStats(A=A, V=V, n=max(c.context_lens, default=0) + c.block_size, D=c.head_dim)


def _from_peaks(inputs: Inputs, rows: list[list[float]]) -> CaseStats:
    """`CaseStats` from the statistics kernel's rows `[qn, pool kn, pool |v|, block kn, block |v|]`, `T` rows per
    (request, KV head) pair in order (`oracle._fast.stats_triton`): A over pairs, in fp64 (Python floats)."""
    ks, vs = _scales_of(inputs)
    per = len(rows) // max(1, inputs.case.batch_size * inputs.case.num_kv_heads)
    A = V = 0.0
    for p0 in range(0, len(rows), max(per, 1)):
        part = rows[p0: p0 + per]
        qn = max(r[0] for r in part)
        kn = max(max(r[1] for r in part) * ks, max(r[3] for r in part))
        A = max(A, qn * kn)
        V = max(V, max(r[2] for r in part) * vs, max(r[4] for r in part))
    return _finished(inputs, A * abs(inputs.case.softmax_scale), V)


def _case_stats_torch(inputs: Inputs) -> CaseStats:
    """The torch engine of `case_stats`."""
    c = inputs.case
    B, K, Hkv, G = c.batch_size, c.block_size, c.num_kv_heads, c.group_size
    f32 = torch.float32
    qn = torch.linalg.vector_norm(inputs.q.to(f32), dim=-1).view(B, K, Hkv, G).amax(dim=(1, 3))  # [B, Hkv]
    ks, vs = _scales_of(inputs)
    k_slot, v_slot = (_slot_reduce(p, c.layout) for p in (inputs.k_pool, inputs.v_pool))  # [pages, ps, Hkv]
    kn, vmax = _owned_max(inputs, k_slot, v_slot)  # [B, Hkv], [B, Hkv]
    kn, vmax = kn * ks, vmax * vs
    if c.block_storage == "dense":
        kn = torch.maximum(kn, torch.linalg.vector_norm(inputs.k_block.to(f32), dim=-1).amax(dim=1))
        vmax = torch.maximum(vmax, inputs.v_block.to(f32).abs().amax(dim=(1, 3)))
    A, V = torch.stack([(qn.double() * kn.double()).amax() * abs(c.softmax_scale), vmax.double().amax()]).tolist()
    return _finished(inputs, A, V)


def _slot_reduce(pool: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`(norm, max |x|)` of every pool slot and head, `[pages, page_size, Hkv]` each, fp32; the pool is read
    `STATS_ELEMENTS` at a time (a production pool is gigabytes: never a whole fp32 copy of it)."""
    pages = pool.shape[0]
    per = max(1, STATS_ELEMENTS // max(1, pool[:1].numel()))
    norms, peaks = [], []
    for p0 in range(0, pages, per):
        x = pool[p0: p0 + per].to(torch.float32)
        if layout == "HND":
            x = x.transpose(1, 2)
        norms.append(torch.linalg.vector_norm(x, dim=-1))
        peaks.append(x.abs().amax(dim=-1))
    if not norms:
        empty = pool.new_zeros((0, *pool.shape[1:3]), dtype=torch.float32)
        return empty, empty
    return torch.cat(norms), torch.cat(peaks)


def _owned_max(inputs: Inputs, k_slot, v_slot) -> tuple[torch.Tensor, torch.Tensor]:
    """Over the pool positions each request owns (context, and the block when appended): the largest key norm and
    the largest |v|, `[B, Hkv]` each (zero for a request owning none)."""
    c = inputs.case
    ps = c.page_size
    own = [L + (c.block_size if c.block_storage == "appended" else 0) for L in c.context_lens]
    T = max(own, default=0)
    dev = inputs.q.device
    B, Hkv = c.batch_size, c.num_kv_heads
    if T == 0:
        z = torch.zeros((B, Hkv), dtype=torch.float32, device=dev)
        return z, z.clone()
    t = torch.arange(T, device=dev).view(1, -1)
    valid = t < torch.tensor(own, device=dev).view(-1, 1)  # [B, T]
    col = torch.clamp(t // ps, max=inputs.page_table.shape[1] - 1).expand(B, -1)
    pid = torch.gather(inputs.page_table.to(torch.long), 1, col)
    pid = torch.where(valid, pid, torch.zeros_like(pid))
    slot = (t % ps).expand(B, -1)
    zero = torch.zeros((), dtype=torch.float32, device=dev)
    kn = torch.where(valid.unsqueeze(-1), k_slot[0][pid, slot], zero)  # [B, T, Hkv]
    vm = torch.where(valid.unsqueeze(-1), v_slot[1][pid, slot], zero)
    return kn.amax(dim=1), vm.amax(dim=1)
