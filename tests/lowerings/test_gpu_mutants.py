"""The GPU mutants of the flashinfer lowerings are each caught on a CUDA GPU (skipped elsewhere)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("key", ["merge_state_natural_lse", "part_a_block_end", "workspace_b_rows", "fa3_silently_fa2"])
def test_gpu_mutant_is_caught(key):
    import lowerings
    from parity.policy import load
    from parity.runner import RunOptions, check_lowering
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
    from parity import flakiness as fl
    from parity import sanitizer
    from parity.policy import load
    from parity.report import write_reports
    from parity.runner import RunOptions, check_lowering
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
