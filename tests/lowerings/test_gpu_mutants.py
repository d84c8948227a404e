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
