"""A fixed set of lowering reports built without drawing or running anything (seeded `random.Random(7)`):
outcomes with hand-made figures (a `-inf` and a `+inf` among them), unsupported and skipped cases, a
shrunk failure with its classification, a crash, an unavailable lowering. `tests/parity/test_outcome.py`
writes them with the report writer of the day and compares the files with those the writer wrote before
the outcome model moved to `parity/engine/outcome.py` (`data/report_before.json`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

FIXED_TIME = "2026-12-01T00:00:00+00:00"


def _case(rng: random.Random, **over: Any):
    from strategies import Limits, build_case
    from strategies._boundaries import _base, _keyed

    p = dict(_base(Limits()), context_lens=[rng.randint(0, 40) for _ in range(rng.randint(1, 3))],
             block_size=rng.choice([1, 2, 4]), seed=rng.randint(0, 999), perm_seed=rng.randint(0, 9))
    p.update(over)
    # Format 2, as when data/report_before.json was written: format 3 changed no field but the version.
    return build_case(_keyed(p)).replace(version=2)


def _outcome(rng: random.Random, name: str, status: str, **over: Any):
    from parity.engine.judge import Comparison
    from parity.engine.runner import CaseOutcome

    case = _case(rng)
    ulp = round(rng.uniform(0, 6), 4)
    figs = {"out_max_abs": round(rng.uniform(0, 1e-2), 6), "out_ulp": ulp, "out_rel_l2": round(rng.uniform(0, 1e-3), 7),
            "lse_max_abs": round(rng.uniform(0, 1e-4), 8), "worst_out": {"b": 0, "i": 0, "h": 0, "d": rng.randint(0, 63)},
            "lse_min": float("-inf"), "yardstick_ratio": float("inf"), "bounds": "[defaults.bfloat16]"}
    comps = [Comparison("output", figures=figs, margins={"out_ulp": ulp / 8, "lse": float(rng.uniform(0, 0.5))})]
    if status == "fail":
        comps[0].failures = [f"output: max abs error {ulp} ulp > bound 0.5 ulp"]
    out = CaseOutcome(name, case, status, comparisons=comps if status != "unsupported" else [],
                      failures=list(comps[0].failures) if status == "fail" else [],
                      calls={"decode": 1}, expected_calls={"decode": 1} if status != "unsupported" else {},
                      compiles={"k": rng.randint(0, 1)}, bounds="[defaults.bfloat16]" if status != "unsupported" else "",
                      bounds_why="the defaults" if status != "unsupported" else "",
                      reason="block_size 4 unsupported" if status == "unsupported" else "",
                      seconds=0.01, phases={"oracle": 0.002, "lowering": 0.003})
    for k, v in over.items():
        setattr(out, k, v)
    return out


def reports():
    """Three lowering reports: `alpha` passes (one unsupported case, one hardening step skipped), `beta`
    fails (a shrunk, classified failure and a crash), `gamma` is unavailable."""
    from parity.engine.flakiness import Classification
    from parity.engine.runner import Failure, LoweringReport, compile_family

    rng = random.Random(7)
    alpha = LoweringReport("alpha", "cpu", "pass", max_compiles=2, seconds=1.25)
    for n in range(6):
        status = "unsupported" if n == 2 else "pass"
        out = _outcome(rng, "alpha", status)
        if n == 4:
            out.skipped = {"determinism": "needs 3.0 GiB, 1.0 GiB free"}
        alpha.absorb(out, ("fam", n % 2))
    beta = LoweringReport("beta", "cpu", "pass", seconds=2.5)
    for n in range(4):
        beta.absorb(_outcome(rng, "beta", "pass"), None)
    bad = _outcome(rng, "beta", "fail")
    beta.absorb(bad, None)
    cls = Classification("reproducible", runs=4, failed=4)
    beta.failures.append(Failure(bad, shrunk=True, classification=cls))
    crash = _outcome(rng, "beta", "fail", comparisons=[], failures=["beta raised RuntimeError: boom (x.py:3)"])
    beta.failures.append(Failure(crash, shrunk=False, sanitizer="no stream errors"))
    beta.status = "fail"
    beta.extra.append("a note")
    gamma = LoweringReport("gamma", "cpu", "unavailable", reason="needs a CUDA GPU")
    return [alpha, beta, gamma]


def header() -> dict[str, Any]:
    return {"run_id": "0" * 32, "started": FIXED_TIME, "git": None,
            "settings": {"lowerings": ["alpha", "beta", "gamma"], "device": "cpu", "profile": "ci", "seed": 7},
            "plugins": [], "policy": {"file": "tolerances.toml", "sha256": "ab" * 32}}


def written(tmp: Path) -> dict[str, str]:
    """The report files the writer of the day writes for `reports()` (times and the torch version fixed)."""
    from parity.report import provenance, files as report

    saved = provenance.now
    provenance.now = lambda: FIXED_TIME
    try:
        report.write_reports(tmp, reports(), device="cpu", profile="ci", tolerances="tolerances.toml",
                             replay=["--device", "cpu"], header=header(), policy_entries=["[defaults.bfloat16]", "[x]"])
    finally:
        provenance.now = saved
    import torch

    out = {}
    for f in sorted(tmp.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            out[str(f.relative_to(tmp))] = f.read_text().replace(torch.__version__, "TORCH").replace(str(tmp), "REPORT")
    out["merged shards"] = report.dumps(merged_shards())
    return out


def merged_shards() -> dict[str, Any]:
    """`alpha` and `beta` as two shards of one lowering (each with its compile families), merged."""
    from parity.report import files as report
    from parity.front import shards

    alpha, beta, _ = reports()
    entries = []
    for r in (alpha, beta):
        e = report.to_json([r], device="cpu", profile="ci", tolerances="t")["lowerings"][r.lowering]
        e[shards.FAMILY_KEYS] = {repr(k): n for k, n in r.compile_families.items()}
        entries.append(e)
    return shards.merge_entries(entries)
