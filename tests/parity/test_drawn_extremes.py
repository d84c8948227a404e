"""How far a check's draws reach the extremes of the case space (`parity.json`'s `drawn.extremes`,
parity/engine/drawn.py; issue 47): counted from the case specs, merged across shards, shown in `summary.md`;
and what the default profiles reach, from their draws alone (an executor that judges nothing, as
scripts/draw_distribution.py draws): the `ci` profile on a CPU, in every seed 0-9, an fp8 value of 448
stored, 128 query rows per KV head, the attention mass on the last context key of its longest context;
the `gpu` profile, both sides of every windowed model row's window edge at production lengths.
"""

from __future__ import annotations

import pytest

import lowerings
from oracle.case import Case
from parity.engine import drawn
from oracle import footprint
from parity.engine.outcome import LoweringReport
from parity.report.drawn_md import summary_lines as drawn_summary_lines
from parity.engine.policy import load
from parity.engine.runner import CaseOutcome, RunOptions, check_lowering
from strategies import MODELS, build_case, check_cases, profile_settings
from tests.strategies.test_extremes import BASE


class Available:
    """A lowering as it would be on the device: available, everything else its own."""

    def __init__(self, lowering) -> None:
        self._lw = lowering

    def __getattr__(self, name: str):
        return getattr(self._lw, name)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""


class DrawOnly:
    """An executor that judges nothing: every supported case passes."""

    def run(self, lowering_name: str, case: Case) -> CaseOutcome:
        return CaseOutcome(lowering_name, case, "pass")


def drawn_by(name: str, device: str, profile: str, seed: int | None = None, **overrides) -> dict:
    """The `drawn` entry of `check --device DEVICE --profile PROFILE [--seed S]` for lowering `name`, drawn only."""
    lw = lowerings.get(name)
    plan = check_cases(lw, device, profile=profile, overrides=overrides or None)
    rep = check_lowering(Available(lw), load(), strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings(profile, seed=seed), opts=RunOptions(device=device),
                         executor=DrawOnly(), seed=seed)
    assert rep.status == "pass" and rep.cases > len(plan.boundaries), rep.extra
    return rep.drawn


def test_extremes_count_merge_and_show():
    d = drawn.new()
    for p in (BASE, dict(BASE, values="full_range", kv_dtype="float8_e4m3fn"), dict(BASE, block_size=16, group=8,
                                                                                   values="plain")):
        drawn.add(d, build_case(p))
    e = d["extremes"]
    assert (e["fp8_stored_max"], e["fp8_subnormal_cases"]) == (448.0, 1)
    assert (e["rows_per_kv_head_max"], e["rows_per_kv_head_max_cases"]) == (128, 1)
    # BASE: peak, no peak_keys: each request's last context key (L = 0: its first block key), W = 10
    assert e["heaviest_key"] == {"L-1": 2, "L": 1} and e["heaviest_last_context_key_longest"] == 40
    assert e["window_edges"] == {"10": {"inside": 3, "past": 0}}  # L = 5 >= W - K - 1: key 0 inside query 0's
    merged = drawn.merge([d, d, None, {"context": {"0": 1}}])  # a report from before `extremes`
    m = merged["extremes"]
    assert m["fp8_stored_max"] == 448.0 and m["rows_per_kv_head_max_cases"] == 2 and m["heaviest_key"]["L-1"] == 4
    assert m["window_edges"]["10"] == {"inside": 6, "past": 0} and merged["context"]["0"] == 1
    rep = LoweringReport("x", "cpu", "pass")
    rep.add(LoweringReport("x", "cpu", "pass", drawn=d))
    rep.add(LoweringReport.from_json("x", {"status": "pass", "drawn": d}), same_process=False)
    assert rep.drawn["extremes"] == m | {"window_edges": m["window_edges"]}
    lines = "\n".join(drawn_summary_lines({"x": {"drawn": d}}))
    assert "| `x` | 448 | 1 | 128 (1) | L-1 2, L 1 | 40 | W 10: 3/0 |" in lines, lines


def test_a_draw_short_of_an_extreme_says_so():
    """The negative control: the figures fall when the draw stops short (no fp8 stored past a few units by
    construction, 64 rows, no mass on the last key)."""
    d = drawn.new()
    drawn.add(d, build_case(dict(BASE, values="plain", kv_dtype="float8_e4m3fn", block_size=16, group=4)))
    e = d["extremes"]
    assert (e["fp8_stored_max"], e["rows_per_kv_head_max"], e["heaviest_key"]) == (0.0, 64, {})


def _reaches_every_extreme(d: dict, longest: int) -> None:
    e = d["extremes"]
    assert e["fp8_stored_max"] >= 400 and e["fp8_subnormal_cases"] >= 1, e
    assert e["rows_per_kv_head_max"] == 128, e
    assert e["heaviest_key"].get("L-1", 0) >= 1 and e["heaviest_last_context_key_longest"] == longest, e


@pytest.mark.parametrize("seed", range(10))
def test_the_ci_profile_reaches_every_extreme_in_every_seed(seed):
    _reaches_every_extreme(drawn_by("context", "cpu", "ci", seed), 8192)


@pytest.mark.parametrize("name", ["decode_rows", "windowed_merge[eager]", "sdpa"])
def test_the_ci_profile_reaches_every_extreme_for_the_cpu_lowerings(name):
    _reaches_every_extreme(drawn_by(name, "cpu", "ci"), 8192)


def test_the_gpu_profile_reaches_every_model_rows_window_edge(monkeypatch):
    """Drawn on the CPU for CUDA (the per-case budget a share of an H200's 139 GiB), judged nowhere."""
    real = footprint.device_case_bytes
    monkeypatch.setattr(footprint, "device_case_bytes", lambda device, share=footprint.CUDA_SHARE: int(
        139 * footprint.GIB * share) if str(device).startswith("cuda") else real(device, share))
    d = drawn_by("windowed_merge[eager]", "cuda", "gpu")
    edges = d["extremes"]["window_edges"]
    for m in MODELS:
        if m.window[1] is not None:
            assert edges[str(m.window[1])]["inside"] and edges[str(m.window[1])]["past"], (m.name, edges)
    _reaches_every_extreme(d, 131072)
