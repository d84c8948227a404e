"""The GPU mutants of the flashinfer lowerings are each caught on a CUDA GPU (skipped elsewhere)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.parity_gpu


@pytest.mark.parametrize("key", ["merge_state_natural_lse", "part_a_block_end", "workspace_b_rows", "fa3_silently_fa2"])
def test_gpu_mutant_is_caught(key):
    import lowerings
    from parity.engine.policy import load
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import Limits, cases, profile_settings
    from tests.gpu_mutants import GPU_MUTANTS

    cls, phrase = GPU_MUTANTS[key]
    lw = cls()
    ok, why = lw.available("cuda")
    if not ok:
        pytest.skip(why)
    fixed = {}
    if key == "workspace_b_rows":
        fixed = dict(block_size=7, context_lens=[2000], batch_size=1)  # small batch, long context: split-KV
    if key == "part_a_block_end":
        fixed = dict(window=("noncausal_swa", 4))
    limits = Limits(max_context=2048, dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(128,))
    t0 = time.perf_counter()
    rep = check_lowering(lw, load(), strategy=cases(lw, limits=limits, **fixed),
                         settings=profile_settings("ci", max_examples=30), opts=RunOptions(device="cuda", profile_every=1),
                         yardstick=lowerings.get("sdpa"))
    msgs = [m for f in rep.failures for m in f.outcome.failures] + rep.extra
    print(f"{key}: caught={rep.status == 'fail'} in {time.perf_counter() - t0:.1f}s; "
          f"shrunk: {rep.failures[0].outcome.case.short() if rep.failures else '-'}; {msgs[:2]}")
    assert rep.status == "fail", f"{key} was not caught"
    assert any(phrase in m for m in msgs), msgs


NONDETERMINISTIC_GPU = {
    # key: (the mutant, the plugin that registers it for the sanitizer's replay, what the sanitizer says)
    "returns_before_side_stream": ("tests.gpu_mutants:ReturnsBeforeSideStream", "tests/gpu_mutants_plugin.py",
                                   "found an unsynchronized access"),
    "stale_running_max": ("tests.hardening_mutants:StaleRunningMax", "tests/hardening_plugin.py",
                          "found no unsynchronized access"),
}


@pytest.mark.parametrize("key", sorted(NONDETERMINISTIC_GPU))
def test_gpu_nondeterminism_is_named_shrunk_counted_and_sanitized(key, tmp_path):
    """Issue 14 on the GPU: a lowering that returns before its side-stream work is done, and one that seeds
    its running max from a workspace the previous call left, are each named nondeterministic (not a canary
    read), shrunk to B=1, with "failed k of R runs" in the failure file and the stream sanitizer's replay
    attached (a finding with its stacks for the race; "found no unsynchronized access" for the workspace)."""
    import importlib
    import json
    from pathlib import Path

    import lowerings
    from parity.engine import flakiness as fl
    from parity.exec import sanitizer
    from parity.engine.policy import load
    from parity.report.files import write_reports
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import Limits, cases, profile_settings

    target, plugin, said = NONDETERMINISTIC_GPU[key]
    module, cls = target.split(":")
    lw = getattr(importlib.import_module(module), cls)()
    ok, why = lw.available("cuda")
    if not ok:
        pytest.skip(why)
    root = Path(__file__).resolve().parents[2]
    sanitize = lambda name, case, hist: sanitizer.replay(name, case, hist, plugins=[root / plugin])  # noqa: E731
    t0 = time.perf_counter()
    rep = check_lowering(lw, load(), strategy=cases(lw, limits=Limits(max_batch=4, max_context=256)),
                         settings=profile_settings("ci", max_examples=30), opts=RunOptions(device="cuda"),
                         yardstick=lowerings.get("sdpa"), sanitizer=sanitize)
    assert rep.status == "fail" and rep.failures, f"{key} was not caught: {rep.extra}"
    write_reports(tmp_path, [rep], device="cuda", profile="ci", tolerances="tolerances.toml")
    saved = json.loads(sorted((tmp_path / "failures").glob("*.json"))[0].read_text())
    print(f"{key}: {time.perf_counter() - t0:.1f}s, {rep.cases} cases; shrunk to {rep.failures[0].outcome.case.short()}; "
          f"{saved['runs']}\n{json.dumps(saved['failures'], indent=1)}\n{saved.get('sanitizer', '')}")
    f = rep.failures[0]
    assert f.outcome.failures[0].startswith(fl.NONDETERMINISTIC), f.outcome.failures
    assert not any(m.startswith(fl.CANARY_READ) for m in f.outcome.failures)
    assert f.outcome.case.batch_size == 1, f.outcome.case.short()
    assert " of 4 runs" in saved["runs"] and saved["runs"].startswith("failed ")
    assert said in saved["sanitizer"], saved["sanitizer"]


# ---- production scale (issue 13): the default `gpu` profile catches each class and shrinks it ----------------

def _keys(case) -> int:
    return max(case.context_lens) + case.block_size


# key -> (where the mutant comes from, its name there, phrase, check of the shrunk case)
PRODUCTION = {
    "split_workspace_wraps": ("cpu", "mutant:split_workspace_wraps", "output: max |O - O_ref|",
                              lambda c: c.batch_size == 1 and _keys(c) == 4097),
    "last_split_unclamped": ("cpu", "mutant:last_split_unclamped", "output", lambda c: c.batch_size == 1 and _keys(c) == 4097),
    "positions_fp16": ("cpu", "mutant:positions_fp16", "output: max |O - O_ref|",
                       lambda c: c.batch_size == 1 and max(c.context_lens) == 2049),
    "positions_bf16": ("cpu", "mutant:positions_bf16", "output: max |O - O_ref|",
                       lambda c: c.batch_size == 1 and max(c.context_lens) == 257),
    "dispatch_threshold_off_by_one": ("cpu", "mutant:dispatch_threshold_off_by_one", "silent fallback",
                                      lambda c: c.batch_size == 33 and max(c.context_lens) == 0),
    "dispatch_threshold_low": ("cpu", "mutant:dispatch_threshold_low", "kernel calls",
                               lambda c: c.batch_size == 32 and max(c.context_lens) == 0),
    "fp8_scales_swapped_torch": ("cpu", "mutant:fp8_scales_swapped", "output",
                                 lambda c: c.kv_dtype == "float8_e4m3fn" and c.k_scale != c.v_scale and c.batch_size == 1),
    "fp8_scales_swapped": ("gpu", "fp8_scales_swapped", "output",
                           lambda c: c.kv_dtype == "float8_e4m3fn" and c.k_scale != c.v_scale and c.batch_size == 1),
    "dispatch_rows_to_33": ("gpu", "dispatch_rows_to_33", "kernel", lambda c: c.batch_size == 33),
    "dispatch_rows_to_31": ("gpu", "dispatch_rows_to_31", "kernel", lambda c: c.batch_size == 32),
}


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(PRODUCTION))
def test_production_mutant_caught_by_the_default_gpu_profile(key):
    """Each production-scale mutant (tests/mutants.py's on CUDA, tests/gpu_mutants.py's flashinfer ones) under
    exactly what `dflash-parity check --device cuda --profile gpu --max-examples 500` draws for it: caught
    within 500 cases and shrunk to the smallest case that shows it (4097 keys, L = 2049 / 257, B = 32 / 33)."""
    import lowerings
    from parity.engine.policy import load
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import check_cases, profile_settings
    from tests import mutants as M
    from tests.gpu_mutants import GPU_MUTANTS

    where, name, phrase, shrunk_ok = PRODUCTION[key]
    lw = M.catalogue()[name] if where == "cpu" else GPU_MUTANTS[name][0]()
    ok, why = lw.available("cuda")
    if not ok:
        pytest.skip(why)
    plan = check_cases(lw, "cuda", profile="gpu")
    first: list[int] = []
    t0 = time.perf_counter()
    rep = check_lowering(lw, load(), strategy=plan.strategy, boundaries=plan.boundaries,
                         settings=profile_settings("gpu", max_examples=500), opts=RunOptions(device="cuda"),
                         yardstick=lowerings.get("sdpa"),
                         progress=lambda r, out: first.append(r.cases) if out.status == "fail" and not first else None)
    msgs = [m for f in rep.failures for m in f.outcome.failures] + rep.extra
    case = rep.failures[0].outcome.case if rep.failures else None
    print(f"{key}: caught={rep.status == 'fail'} at case {first[:1]} of {rep.cases} in {time.perf_counter() - t0:.1f}s; "
          f"shrunk: {case.short() if case else '-'}; {msgs[:2]}")
    assert rep.status == "fail" and first and first[0] <= 500, f"{key} was not caught within 500 cases"
    assert any(phrase in m for m in msgs), msgs
    assert case is not None and shrunk_ok(case), f"{key}: not the smallest case that shows it: {case.short()}"


@pytest.mark.slow
def test_int32_offsets_caught_by_the_scale_profile(tmp_path):
    """`hybrid_paged` with 32-bit pool offsets: correct on every pool of the default profiles, caught by the
    `scale` profile (pools padded past 2**31 elements), isolated (the wrapped offset may fault), and shrunk
    to one request in a pool just past 2**31 elements."""
    import lowerings
    from parity.exec.isolation import IsolatedExecutor
    from oracle.footprint import pool_elements
    from parity.engine.policy import load
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import check_cases, profile_settings
    from tests.gpu_mutants import HybridInt32Offsets

    lw = HybridInt32Offsets()
    ok, why = lw.available("cuda")
    if not ok:
        pytest.skip(why)
    plugin = Path(__file__).resolve().parents[1] / "gpu_mutants_plugin.py"
    opts = RunOptions(device="cuda")
    plan = check_cases(lw, "cuda", profile="scale")
    t0 = time.perf_counter()
    with IsolatedExecutor(plugins=[plugin], opts=opts, yardstick="sdpa", case_timeout=300,
                          inflight_dir=tmp_path / "inflight") as ex:
        rep = check_lowering(lw, load(), strategy=plan.strategy, boundaries=plan.boundaries,
                             settings=profile_settings("scale"), opts=opts, yardstick=lowerings.get("sdpa"), executor=ex)
    case = rep.failures[0].outcome.case if rep.failures else None
    msgs = [m for f in rep.failures for m in f.outcome.failures] + rep.extra
    print(f"hybrid_int32_offsets: caught={rep.status == 'fail'} in {rep.cases} cases, {time.perf_counter() - t0:.1f}s; "
          f"shrunk: {case.short() if case else '-'}, pool {pool_elements(case) if case else '-'} elements; {msgs[:2]}")
    assert rep.status == "fail" and case is not None
    assert 2**31 < pool_elements(case) < 2**32 and case.batch_size == 1, case.short()
