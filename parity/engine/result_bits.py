"""Everything a lowering returns, compared bit for bit: its output, LSE and every partial.

Used inside one case (`parity.engine.hardening`: the other canary, determinism), across re-runs
(`parity.engine.flakiness`: the probe) and by the stream sanitizer's replay (`parity.exec.sanitizer`).
"""

from __future__ import annotations

import torch

from lowerings.protocol import LoweringResult

NONDETERMINISTIC = "nondeterministic across identical runs (a race, a missing stream sync, or uninitialized memory)"
STATE = "depends on state left by a previous call"


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """A bit-exact view for comparisons where NaN must equal NaN."""
    t = t.detach()
    size = t.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return t.contiguous().view(as_int)


def result_parts(result: LoweringResult) -> dict[str, torch.Tensor | None]:
    """Every tensor a result holds, by label: `output`, `LSE`, `partial A output`, `partial A LSE`, ..."""
    parts: dict[str, torch.Tensor | None] = {"output": result.out, "LSE": result.lse}
    for name, p in result.partials.items():
        parts[f"partial {name} output"] = p.out
        parts[f"partial {name} LSE"] = p.lse
    return parts


def snapshot(result: LoweringResult) -> dict[str, torch.Tensor | None]:
    """`result_parts` as bit patterns copied to the host (later calls may reuse the lowering's buffers)."""
    return {k: None if t is None else bit_view(t).cpu().clone() for k, t in result_parts(result).items()}


def differing_parts(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> list[tuple[str, int]]:
    """`(label, elements that differ)` for each part whose bits differ (-1: present in one only, or reshaped)."""
    diffs = []
    for label in dict.fromkeys([*a, *b]):
        x, y = a.get(label), b.get(label)
        if x is None and y is None:
            continue
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            diffs.append((label, -1))
            continue
        n = int((x != y).sum())
        if n:
            diffs.append((label, n))
    return diffs


def parts_of(result: LoweringResult) -> dict[str, torch.Tensor | None]:
    """`result_parts` as bit views on the device (for comparisons inside one case)."""
    return {k: None if t is None else bit_view(t) for k, t in result_parts(result).items()}


def describe_diffs(diffs: list[tuple[str, int]]) -> str:
    """`"the LSE (3 element(s)), partial A output (1 element(s))"`."""
    def one(label: str, n: int) -> str:
        what = f"the {label}" if label in ("output", "LSE") else label
        return f"{what} ({n} element(s))" if n >= 0 else f"{what} (returned in one run only, or reshaped)"
    return ", ".join(one(label, n) for label, n in diffs)


def differing_requests(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> tuple[str, list[int]]:
    """The first part that differs and the requests (leading index) where it does."""
    for label, n in differing_parts(a, b):
        x, y = a[label], b[label]
        if n > 0 and x is not None and x.dim() >= 1:
            diff = (x != y).reshape(x.shape[0], -1).any(-1)
            return label, [int(i) for i in diff.nonzero().flatten()]
    return "output", []


def nondeterminism_message(detail: str, state: bool) -> str:
    msg = f"{NONDETERMINISTIC}: {detail}"
    if state:
        msg += f"; it {STATE} (a workspace or buffer it reads before writing)"
    return msg
