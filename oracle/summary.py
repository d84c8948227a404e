"""What the judge reads of a reference output, in one host transfer (`OutputSummary`): from the Triton engine's
figures (`oracle/_finish_kernel.py` computes them beside the output) or, for the torch engine, reduced from the
tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OutputSummary:
    """What the judge reads of a reference, in one host transfer: `max_abs_out` and `rms_out` over the finite
    elements of `out` (the root mean square over all of them, a non-finite one counted as 0), `min_abs_lse` and
    `max_abs_lse` over the finite LSEs (0 where none), and `non_finite`: outputs NaN or infinite plus LSEs NaN or
    `+inf` (an empty row's `-inf` is not one)."""

    max_abs_out: float
    rms_out: float
    min_abs_lse: float
    max_abs_lse: float
    non_finite: int


def summary_of_figures(figures: torch.Tensor, numel: int) -> OutputSummary:
    """`OutputSummary` from the Triton engine's per-program figures `[N, 5]` (`oracle/_finish_kernel.py`) of an output
    of `numel` elements: one transfer."""
    rows = figures.tolist()
    fin = [r[2] for r in rows if math.isfinite(r[2])]
    return OutputSummary(max((r[0] for r in rows), default=0.0), math.sqrt(sum(r[1] for r in rows) / max(numel, 1)),
                         min(fin, default=0.0), max((r[3] for r in rows), default=0.0), int(sum(r[4] for r in rows)))


def summary_of_tensors(out: torch.Tensor, lse: torch.Tensor) -> OutputSummary:
    """`OutputSummary` of `out [B, K, Hq, D]` and `lse [B, K, Hq]` reduced with torch ops: one transfer."""
    o, lv = out.detach().to(torch.float64), lse.detach().to(torch.float64)
    o_fin, l_fin = torch.isfinite(o), torch.isfinite(lv)
    oa = torch.where(o_fin, o.abs(), torch.zeros((), dtype=o.dtype, device=o.device))
    la = lv.abs()
    zero = o.new_zeros(())
    vals = torch.stack([
        oa.max() if o.numel() else zero,
        oa.square().sum() if o.numel() else zero,
        torch.where(l_fin, la, torch.full_like(la, math.inf)).min() if lv.numel() else zero + math.inf,
        torch.where(l_fin, la, torch.zeros_like(la)).max() if lv.numel() else zero,
        ((~o_fin).sum() + (torch.isnan(lv) | torch.isposinf(lv)).sum()).to(o.dtype)]).tolist()
    mx, sq, lo, hi, bad = vals
    return OutputSummary(mx, math.sqrt(sq / max(o.numel(), 1)), lo if math.isfinite(lo) else 0.0, hi, int(bad))
