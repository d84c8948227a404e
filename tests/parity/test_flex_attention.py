"""PyTorch's eager `flex_attention` as a user plugs it in (`examples/plugin_flex_attention.py`), judged on issue 47's
near-tie cases (fp16 `huge`, B=1 L=[128] K=1 heads 18/3 D=128): within 2.1 fp16 ulps of the fp64 truth, it failed
the verdict of the fp32 oracle there (whose own error reached 5 ulps) and passes the golden one. A flex fed q
pre-multiplied by the softmax scale in fp16 (a common shortcut: every score then carries fp16's relative rounding)
loses real precision: the verdict fails it and says so against the working-dtype reference. Figures: docs/lab/flex-attention.md.
"""

from __future__ import annotations

import dataclasses
import runpy
from pathlib import Path

import pytest
import torch

import lowerings
from lowerings import LoweringResult
from parity.engine import yardstick
from parity.engine.case_run import run_case
from parity.engine.invocation import RunOptions
from parity.engine.policy import load as load_policy
from tests.oracle.oracle_cases import build_case

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugin_flex_attention.py"
OPTS = RunOptions(check_determinism=False, check_inputs_untouched=False)


@pytest.fixture
def flex(restore_registry):
    runpy.run_path(str(PLUGIN))
    return lowerings.get("flex_attention")


def _near_tie(seed: int):
    return dataclasses.replace(build_case((128,), 1, 3, 6, 128, 16, dtype="float16"), values="huge", seed=seed)


@pytest.mark.parametrize("seed", (62, 177, 317))
def test_flex_passes_where_the_fp32_oracle_failed_it(flex, seed):
    out = run_case(flex, _near_tie(seed), load_policy(None), OPTS, yardstick.get(yardstick.DEFAULT))
    assert out.status == "pass", out.failures
    assert out.margin < 0.5 and out.oracle["precision"] == "float64"


def test_q_prescaled_in_fp16_fails(flex):
    class PrescaledQ(type(flex)):
        name = "flex_attention[q prescaled in fp16]"

        def run(self, inputs):
            c = inputs.case
            q = inputs.q.float()
            big = dataclasses.replace(inputs, q=(q * c.softmax_scale).to(inputs.q.dtype))  # q pre-scaled in fp16
            res = super().run(dataclasses.replace(big, case=dataclasses.replace(c, scale=1.0)))
            return LoweringResult(out=res.out, lse=res.lse)

    out = run_case(PrescaledQ(), _near_tie(62), load_policy(None), OPTS, yardstick.get(yardstick.DEFAULT))
    assert out.status == "fail"
    assert any("working-dtype reference's" in f or "ulp of max" in f for f in out.failures), out.failures
