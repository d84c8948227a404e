"""The judge: one lowering's output against the oracle under a `Tolerance`, every figure kept.

One public entry point, `compare`, and small pure helpers that build the mismatch messages (in the
manner of `torch.testing._comparison`). A `Comparison` carries the figures (max abs, ulps, rel L2,
yardstick ratio, LSE error), where the worst element sits (request, query, head, dim) and the margin
(worst error as a fraction of its bound) of each criterion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from oracle.ulp import ulp
from parity.engine.tolerance import Tolerance
from parity.engine.yardstick import describe as yardstick_describe


@dataclass
class Comparison:
    """Result of comparing one output (or partial) with the oracle."""

    label: str
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    margins: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def margin(self) -> float:
        return max(self.margins.values(), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "passed": self.passed, "failures": list(self.failures),
                "figures": self.figures, "margins": self.margins, "margin": self.margin}


def _where(shape: tuple[int, ...], flat: int, names: tuple[str, ...]) -> dict[str, int]:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return dict(zip(names, reversed(idx)))


def _fmt_where(w: dict[str, int]) -> str:
    names = {"b": "request", "i": "query", "h": "head", "d": "dim"}
    return ", ".join(f"{names.get(k, k)} {v}" for k, v in w.items())


def _scalars(*values: torch.Tensor | None) -> list[float]:
    """The 0-d tensors `values` as Python floats, read in one transfer (None reads as 0.0)."""
    present = [v for v in values if v is not None]
    if not present:
        return [0.0] * len(values)
    got = iter(torch.stack([v.to(torch.float64) for v in present]).tolist())
    return [next(got) if v is not None else 0.0 for v in values]


def _nonfinite_line(label: str, n: int, out: torch.Tensor, bad: torch.Tensor, names: tuple[str, ...]) -> str:
    flat = int(bad.flatten().nonzero()[0])
    w = _where(tuple(out.shape), flat, names)
    val = out.flatten()[flat].item()
    return f"{label}: {n} non-finite value(s) where the oracle is finite; first {val} at {_fmt_where(w)}"


def compare(label: str, out: torch.Tensor, lse_nat: torch.Tensor | None, ref_out: torch.Tensor,
            ref_lse: torch.Tensor, *, dtype: str, tol: Tolerance,
            yardstick_out: torch.Tensor | None = None, bound_from: Mapping[str, str] | None = None,
            yardstick_name: str | None = None) -> Comparison:
    """Judge `out [B, K, Hq, D]` and natural-log `lse_nat [B, K, Hq]` against the oracle's fp32 values.

    Criteria (docs/semantics.md 5): max abs error in ulps of `max |O_ref|`; relative L2; the yardstick rule
    when `yardstick_out` (the case attended in the working dtype: `parity.engine.yardstick`, named `yardstick_name` in a
    failure) is given; LSE abs error in natural-log units (without `lse_nat`, none: the figures say
    `lse_checked: False`);
    NaN/Inf where the oracle is finite always fails. `bound_from` (tolerance key -> "from [entry]: reason",
    `ToleranceSource.citations()`) is quoted next to each bound a failure names.
    """
    cmp = Comparison(label)
    src = _citer(bound_from)
    names4 = ("b", "i", "h", "d")
    if tuple(out.shape) != tuple(ref_out.shape):
        cmp.failures.append(f"{label}: output shape {tuple(out.shape)}, expected {tuple(ref_out.shape)}")
        cmp.margins["shape"] = math.inf
        return cmp
    o = out.detach().to(device=ref_out.device, dtype=torch.float64)
    r = ref_out.detach().to(torch.float64)
    y = yardstick_out.detach().to(device=ref_out.device, dtype=torch.float64) if yardstick_out is not None else None
    finite = torch.isfinite(o)
    bad = ~finite & torch.isfinite(r)  # NaN/Inf where the oracle is finite
    err = torch.where(finite, (o - r).abs(), torch.full_like(o, math.inf))
    diff = torch.where(finite, o - r, torch.zeros_like(o))
    # Every scalar the verdict needs, computed where the tensors are and read back in one transfer (on a GPU
    # each `float(t)` is a synchronization): the same operations as one read each, so the same figures.
    score_scale = None  # max |LSE_ref| over finite rows: the size of the scores, for the `*_score_rel` terms
    if ((y is not None and tol.yardstick_score_rel > 0) or tol.out_score_rel > 0) and ref_lse.numel():
        score_scale = torch.where(torch.isfinite(ref_lse), ref_lse.abs(), torch.zeros_like(ref_lse)).max()
    n_bad, ref_max, max_abs, flat, ref_norm, diff_norm, y_err, lse_scale = _scalars(
        bad.sum(), r.abs().max() if r.numel() else None,
        err.max() if err.numel() else None, err.flatten().argmax() if err.numel() else None,
        torch.linalg.vector_norm(r), torch.linalg.vector_norm(diff),
        (y - r).abs().max() if y is not None and y.numel() else None, score_scale)
    flat = int(flat)
    if n_bad:
        cmp.failures.append(_nonfinite_line(label if label == "output" else f"{label} output", int(n_bad), o, bad,
                                            names4))
        cmp.margins["nonfinite"] = math.inf
    unit = ulp(ref_max, dtype) if ref_max > 0 else ulp(1.0, dtype)
    e = _OutputError(max_abs=max_abs, ulps=max_abs / unit, unit=unit, ref_max=ref_max,
                     rel_l2=diff_norm / ref_norm if ref_norm > 0 else diff_norm, lse_scale=lse_scale, flat=flat,
                     worst=_where(tuple(o.shape), flat, names4) if err.numel() else {})
    cmp.figures.update(out_max_abs=max_abs, out_ulp=e.ulps, ulp_unit=unit, ref_max_abs=ref_max, out_rel_l2=e.rel_l2,
                       worst_out=e.worst)
    if math.isfinite(max_abs):
        _judge_output_bounds(cmp, label, e, tol, src, (o, r))
    if yardstick_out is not None and math.isfinite(max_abs):
        _judge_yardstick_rule(cmp, label, e, tol, src, y_err, yardstick_describe(yardstick_name, dtype))
    if lse_nat is not None:
        cmp_lse(cmp, label, lse_nat, ref_lse, tol, bound_from)
    else:  # an output-only lowering (`lse_base = NO_LSE`): judged alone, and its figures say so
        cmp.figures["lse_checked"] = False
    return cmp


@dataclass(frozen=True)
class _OutputError:
    """One output's error against the oracle, read back at once: `max_abs` = max |O - O_ref| (at flat index
    `flat`, `worst` its request/query/head/dim), in ulps (`ulps`) of `unit` = ulp(max |O_ref| = `ref_max`) in the
    working dtype; `rel_l2` = ||O - O_ref|| / ||O_ref||; `lse_scale` = max |LSE_ref| over finite rows (0 when unused)."""

    max_abs: float
    ulps: float
    unit: float
    ref_max: float
    rel_l2: float
    lse_scale: float
    flat: int
    worst: dict[str, int]


def _judge_output_bounds(cmp: Comparison, label: str, e: _OutputError, tol: Tolerance, src,
                         out_ref: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The absolute bound (`out_max_ulp` ulps, plus `out_score_rel`'s score-size term) and the relative L2 bound
    (`out_rel_l2`) on the output: margins, figures and failures into `cmp`. `out_ref`: the output and the oracle's
    (float64), read at the worst element for a failure's message."""
    o, r = out_ref
    # `out_score_rel` (0 in the defaults): the same score-size term as the yardstick's, on the absolute
    # bound, for a kernel whose measured score error moves outputs past the dtype's rounding at large scores.
    out_term = tol.out_score_rel * e.lse_scale * e.ref_max if tol.out_score_rel > 0 else 0.0
    cmp.margins["out_ulp"] = e.max_abs / (tol.out_max_ulp * e.unit + out_term) if out_term else e.ulps / tol.out_max_ulp
    if out_term:
        cmp.figures["out_score_term"] = out_term
    if cmp.margins["out_ulp"] > 1:
        bound = f"bound {tol.out_max_ulp:g} ulp{src('out_max_ulp')}"
        if out_term:
            out_src = src("out_score_rel")
            bound += (f" + {tol.out_score_rel:g} x |LSE_ref| {e.lse_scale:.6g} x max|O_ref| {e.ref_max:.4g} = "
                      f"{(tol.out_max_ulp * e.unit + out_term) / e.unit:.2f} ulp"
                      + (f" ({out_src.strip()})" if out_src and out_src != src("out_max_ulp") else ""))
        cmp.failures.append(
            f"{label}: max |O - O_ref| = {e.max_abs:.4g} = {e.ulps:.2f} ulp of max|O_ref| = {e.ref_max:.4g} "
            f"({bound}) at {_fmt_where(e.worst)}: got {float(o.flatten()[e.flat]):.6g}, "
            f"expected {float(r.flatten()[e.flat]):.6g}")
    cmp.margins["out_rel_l2"] = e.rel_l2 / tol.out_rel_l2
    if e.rel_l2 >= tol.out_rel_l2:
        cmp.failures.append(f"{label}: relative L2 error {e.rel_l2:.3g} >= {tol.out_rel_l2:g}{src('out_rel_l2')}")


def _judge_yardstick_rule(cmp: Comparison, label: str, e: _OutputError, tol: Tolerance, src, y_err: float,
                          yardstick_text: str) -> None:
    """The yardstick rule: max |O - O_ref| within `yardstick_factor` x the yardstick's own error `y_err` (the case
    attended in the working dtype, `yardstick_text` naming it) + `yardstick_floor_ulp` ulps (+ the score-size term
    of `yardstick_score_rel`): margin, figures and failure into `cmp`."""
    # A kernel whose scores carry a relative error r (measured: `yardstick_score_rel`) moves the output by
    # up to about r |s| max|v - O| (near a tie of two keys, r |s| p(1-p) |v1 - v2|): the bound grows with
    # the size of the scores, max |LSE_ref|, times max |O_ref|. 0 (the defaults): no such term.
    score_term = tol.yardstick_score_rel * e.lse_scale * e.ref_max
    bound = tol.yardstick_factor * y_err + tol.yardstick_floor_ulp * e.unit + score_term
    cmp.figures.update(yardstick_max_abs=y_err, yardstick_bound=bound,
                       yardstick_ratio=(e.max_abs / y_err) if y_err > 0 else None)
    if score_term:
        cmp.figures["yardstick_score_term"] = score_term
    cmp.margins["yardstick"] = e.max_abs / bound
    if e.max_abs > bound:
        floor_src = src("yardstick_floor_ulp")
        terms = f" + {tol.yardstick_floor_ulp:g} ulp"
        if floor_src and floor_src != src("yardstick_factor"):
            terms += f" ({floor_src.strip()})"
        if score_term:
            score_src = src("yardstick_score_rel")
            terms += (f" + {tol.yardstick_score_rel:g} x |LSE_ref| {e.lse_scale:.6g} x max|O_ref| {e.ref_max:.4g}"
                      + (f" ({score_src.strip()})" if score_src else ""))
        cmp.failures.append(
            f"{label}: max error {e.max_abs:.4g} exceeds {tol.yardstick_factor:g} x "
            f"{yardstick_text} error {y_err:.4g}{terms} = {bound:.4g} (yardstick rule{src('yardstick_factor')})")


def _citer(bound_from: Mapping[str, str] | None):
    """`src(key)` -> `" from [entry]: reason"` (with a leading space), or "" without `bound_from`."""
    return lambda key: f" {bound_from[key]}" if bound_from and bound_from.get(key) else ""


def cmp_lse(cmp: Comparison, label: str, lse_nat: torch.Tensor, ref_lse: torch.Tensor, tol: Tolerance,
            bound_from: Mapping[str, str] | None = None) -> None:
    names3 = ("b", "i", "h")
    if tuple(lse_nat.shape) != tuple(ref_lse.shape):
        cmp.failures.append(f"{label}: LSE shape {tuple(lse_nat.shape)}, expected {tuple(ref_lse.shape)}")
        cmp.margins["lse_shape"] = math.inf
        return
    l = lse_nat.detach().to(device=ref_lse.device, dtype=torch.float64)
    r = ref_lse.detach().to(torch.float64)
    bad = ~torch.isfinite(l) & torch.isfinite(r)
    # Empty rows: the oracle's -inf must be matched by -inf.
    wrong_empty = torch.isneginf(r) & ~torch.isneginf(l)
    fin = torch.isfinite(r) & torch.isfinite(l)
    err = torch.where(fin, (l - r).abs(), torch.zeros_like(l))
    # Bound per row: lse_abs + lse_rel * |LSE_ref| (lse_rel is 0 unless a lowering's measured error scales).
    bound = tol.lse_abs + tol.lse_rel * torch.where(fin, r.abs(), torch.zeros_like(r))
    ratio = err / bound
    some = err.numel() > 0
    fl = ratio.flatten().argmax() if some else None
    n_bad, n_wrong_empty, flat, max_abs, worst_bound, worst_ratio = _scalars(  # one transfer (see `compare`)
        bad.sum(), wrong_empty.sum(), fl, err.max() if some else None,
        bound.flatten()[fl] if some else None, ratio.flatten()[fl] if some else None)
    if n_bad:
        cmp.failures.append(_nonfinite_line(f"{label} LSE", int(n_bad), l, bad, names3))
        cmp.margins["lse_nonfinite"] = math.inf
    if n_wrong_empty:
        w = _where(tuple(l.shape), int(wrong_empty.flatten().nonzero()[0]), names3)
        cmp.failures.append(f"{label} LSE: a row with no visible key must give -inf; got {float(l[tuple(w.values())]):.6g} at {_fmt_where(w)}")
        cmp.margins["lse_empty"] = math.inf
    if not some:
        return
    flat = int(flat)
    worst = _where(tuple(l.shape), flat, names3)
    cmp.figures.update(lse_max_abs=max_abs, worst_lse=worst)
    cmp.margins["lse"] = worst_ratio
    if cmp.margins["lse"] > 1:
        max_abs = float(err.flatten()[flat])
        got, exp = float(l.flatten()[flat]), float(r.flatten()[flat])
        cite = _citer(bound_from)
        src = cite("lse_abs")
        if tol.lse_rel > 0 and cite("lse_rel") != src:
            src += f"; lse_rel{cite('lse_rel')}"
        cmp.failures.append(f"{label}: max |LSE - LSE_ref| = {max_abs:.4g} (natural log; bound {worst_bound:.4g}{src}) "
                            f"at {_fmt_where(worst)}: got {got:.6g}, expected {exp:.6g}{lse_base_hint(l, r, ratio > 1)}")

def lse_base_hint(lse: torch.Tensor, ref: torch.Tensor, failing: torch.Tensor) -> str:
    """A hint when some failing row's LSE is exactly the oracle's times ln 2 (or over it): a base mix-up.
    Any failing row, not only the worst: in a merge, rows whose other part weighs in are off by less."""
    q = lse / torch.where(failing & (ref != 0), ref, torch.full_like(ref, math.nan))
    if bool(((q - math.log(2)).abs() < 1e-3).any()):
        return " (got = expected x ln 2: a base-2 LSE converted twice?)"
    if bool(((q - 1 / math.log(2)).abs() < 1e-3).any()):
        return " (got = expected / ln 2: a base-2 LSE taken as natural log?)"
    return ""

