"""A speed change must not change what a run finds: the same seeded CPU run gives the verdicts, cases,
figures and shrunk failures recorded in `data/figures_seed3.json` before the speed work of the issue
"Four times the cases per GPU-minute" (the yardstick without its unused LSE, thread counts, ...).

The run: `check --device cpu --seed 3 --max-examples 25` (hardening on, in process) over the torch lowerings
and one mutant (`examples/plugin_window_off_by_one.py`: its failure is found and shrunk), small shapes.
Verdicts, case counts, classes, the worst and shrunk cases and the failure messages compare exactly; the
floating-point figures to `FIGURE_REL` relative. The figures are errors of bf16 results against an fp32
reference, and the reference's own fp32 rounding follows the CPU (the SIMD width torch's kernels pick): one
fp32 ulp of the reference (6e-8 of |O|) moves an error near 1e-3 of |O| by ~1e-4 of itself. Measured: the
fixture, recorded on one 2-core machine of CI's kind, and a run on another differ by up to 2.8e-5 relative
(`worst_ulp` 0.6469574 against 0.6469421, `yardstick_ratio` 1.0865012 against 1.0864706), every verdict,
case and shrunk failure identical. A speed change that alters what a run finds changes those exactly.

One exception, measured: where a run's worst LSE error is at the fp32 floor (`lse_max_abs` <= `LSE_TIE_FLOOR`,
a few fp32 ulps of an LSE near 1-10), several elements tie for it and the order of the fp32 sums picks which
one is reported: reading the decode rows of a request through one gather moved `decode_rows`' worst LSE element
from row 1 to row 3, both at 2.38e-7 (2 fp32 ulps). There the location is not compared; the value still is.

Regenerate (only when a change is meant to change what a run finds, and say why in the commit):
    python tests/parity/test_figures_unchanged.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "figures_seed3.json"
MUTANT = ROOT / "examples" / "plugin_window_off_by_one.py"
LOWERINGS = ("sdpa", "context", "decode_rows", "windowed_merge[eager]", "my_windowed_merge")
ARGS = ["--device", "cpu", "--seed", "3", "--max-examples", "25", "--no-isolate", "--quiet", "--flaky-runs", "2",
        "--plugin", str(MUTANT), "--limit", "max_batch=3", "--limit", "max_context=96",
        "--limit", "max_production_context=0"]
FIGURE_REL = 1e-3  # see the module docstring: 2.8e-5 measured across two CPUs, 36x headroom
LSE_TIE_FLOOR = 1e-6  # see the module docstring: a worst LSE error this small is a tie at the fp32 floor
KEPT = ("status", "cases", "passed", "unsupported", "judged", "calls_checked", "classes", "drawn", "worst_margin",
        "worst_case", "worst_figures", "worst_ulp", "worst_ulp_case", "worst_rel_l2", "worst_rel_l2_case")
FAILURE_KEPT = ("case", "shrunk", "message")


def figures(report_dir: Path) -> dict:
    """What the run found, per lowering: the fields of `KEPT` and its failures' cases and messages."""
    import lowerings
    from lowerings import registry
    from parity.front import cli

    lowerings.names()
    with registry.restored():
        argv = ["check", *ARGS, "--report", str(report_dir)]
        for name in LOWERINGS:
            argv += ["--lowering", name]
        code = cli.main(argv)
    data = json.loads((report_dir / "parity.json").read_text())
    out = {"exit": code, "verdict": data["verdict"], "lowerings": {}}
    for name in LOWERINGS:
        entry = data["lowerings"][name]
        kept = {k: entry.get(k) for k in KEPT}
        kept["failures"] = [{k: f.get(k) for k in FAILURE_KEPT} for f in entry.get("failures", [])]
        out["lowerings"][name] = kept
    return out


def _at_the_fp32_floor(want: dict, got: dict) -> bool:
    """Both are figures whose worst LSE error is a tie at the fp32 floor: its location is not compared."""
    a, b = want.get("lse_max_abs"), got.get("lse_max_abs")
    return isinstance(a, float) and isinstance(b, float) and max(a, b) <= LSE_TIE_FLOOR


def differences(want, got, path: str = "") -> list[str]:
    """Where `got` differs from `want`: exact for everything but floats (`FIGURE_REL` relative), and the
    location of a worst LSE error at the fp32 floor (`LSE_TIE_FLOOR`), not compared."""
    if isinstance(want, dict) and isinstance(got, dict):
        if "worst_lse" in want and _at_the_fp32_floor(want, got):
            want, got = ({k: v for k, v in d.items() if k != "worst_lse"} for d in (want, got))
        out = [f"{path}.{k}: missing" for k in want if k not in got]
        out += [f"{path}.{k}: not in the fixture" for k in got if k not in want]
        for k in want:
            if k in got:
                out += differences(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(got)} items, the fixture has {len(want)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isclose(want, got, rel_tol=FIGURE_REL, abs_tol=0.0) or (math.isnan(want) and math.isnan(got)):
            return []
        return [f"{path}: {got!r}, the fixture has {want!r}"]
    return [] if want == got else [f"{path}: {got!r}, the fixture has {want!r}"]


@pytest.mark.usefixtures("single_threaded_torch")
def test_a_seeded_cpu_run_finds_what_it_found_before(tmp_path):
    want = json.loads(FIXTURE.read_text())
    got = figures(tmp_path / "report")
    assert got["lowerings"]["my_windowed_merge"]["failures"], "the mutant's failure is part of what is compared"
    assert got["lowerings"]["my_windowed_merge"]["failures"][0]["shrunk"]
    diff = differences(want, got)
    assert not diff, "the seeded run changed:\n" + "\n".join(diff[:20])


def test_the_comparison_sees_a_changed_figure():
    want = json.loads(FIXTURE.read_text())
    got = json.loads(FIXTURE.read_text())
    fig = got["lowerings"]["sdpa"]["worst_figures"]
    key = next(k for k, v in fig.items() if isinstance(v, float) and v)
    fig[key] *= 1 + 10 * FIGURE_REL
    got["lowerings"]["context"]["cases"] += 1
    diff = differences(want, got)
    assert any(f"sdpa.worst_figures.{key}" in d for d in diff) and any("context.cases" in d for d in diff)


def test_a_worst_lse_location_is_compared_above_the_fp32_floor():
    """A tie at the fp32 floor may move (the module docstring); above it, a moved worst LSE element is a change."""
    want = {"lse_max_abs": 2.4e-7, "worst_lse": {"b": 0, "h": 0, "i": 1}}
    got = {"lse_max_abs": 2.4e-7, "worst_lse": {"b": 0, "h": 0, "i": 3}}
    assert differences(want, got) == []
    want["lse_max_abs"] = got["lse_max_abs"] = 3e-4
    assert differences(want, got) == [".worst_lse.i: 3, the fixture has 1"]
    got["lse_max_abs"] = 2.4e-7  # the value itself is still compared
    assert ".lse_max_abs: 2.4e-07, the fixture has 0.0003" in differences(want, got)


if __name__ == "__main__":  # regenerate the fixture
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(figures(Path(tmp) / "report"), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
