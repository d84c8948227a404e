"""Output-only lowerings (issue 47, point 5): a lowering declares `lse_base = NO_LSE`, its `run` returns
`lse=None`, its output (and each partial's) is judged alone, and every report says "LSE unchecked".

The declaration is validated (`register` refuses another value, naming it), a result that contradicts it
fails the lowering either way, a wrong output is still caught, and the example plugin
(`examples/plugin_output_only.py`, torch SDPA returning the output alone) passes `check` on a CPU with
`"lse_checked": false` in `parity.json`, "LSE unchecked" in the terminal table, `summary.md` and
`junit.xml`, and in pytest's own junit XML and terminal summary. The gate's `lse-dropped` rule:
tests/parity/test_gate_adversarial.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import strategies as st

import lowerings
from lowerings import NO_LSE, LoweringResult, Partial, registry
from lowerings.protocol import BASE_E, protocol_violations, returns_lse
from lowerings.torch_emulation import WindowedMerge
from parity.front import cli
from parity.report import lse as lse_report
from parity.engine import policy as parity_policy
from parity.front.pytest_parts import failure_text
from parity.engine.runner import RunOptions, check_lowering, run_case
from strategies import Limits, build_case, cases, profile_settings
from tests.mutant_bases import ContextMutant, context_read
from tests.plugin_runs import assert_outcomes, not_an_xdist_worker, plugin_args

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin_output_only.py"
TINY = ["--limit", "max_batch=2", "--limit", "max_context=20", "--limit", "head_dims=16", "--limit", "max_kv_heads=1",
        "--limit", "max_group=2", "--limit", "max_block=3", "--limit", "max_production_context=0"]

pytestmark = pytest.mark.usefixtures("restore_registry", "single_threaded_torch")  # tests/conftest.py
pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def policy():
    return parity_policy.load()


def _case(**over):
    base = dict(context_lens=[5, 17], block_size=3, num_kv_heads=2, group=2, head_dim=16, page_size=16,
                window=("noncausal_swa", 4), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
                layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=1,
                extra_pages=0, perm_seed=7, seed=3)
    return build_case(dict(base, **over))


def _main(argv, capsys) -> tuple[int, str]:
    with registry.restored():  # the plugin each command loads is dropped after it
        code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().out


class OutputOnlyContext(ContextMutant):
    """The torch context lowering, returning its output alone."""

    name = "output_only_context"
    lse_base = NO_LSE

    def run(self, inputs):
        return LoweringResult(out=super().run(inputs).out, lse=None)


class DropsTheLastKey(OutputOnlyContext):
    """An output-only mutant: each request reads one key too few (its last block key)."""

    name = "mutant:output_only_drops_last_key"

    def read(self, inputs):
        c = inputs.case
        return context_read(inputs, kv_lens=[L + c.block_size - 1 for L in inputs.context_lens_host])


class Declares(OutputOnlyContext):
    """Returns what it is told, whatever it declares."""

    def __init__(self, declared, returns_lse: bool, partial: tuple | None = None) -> None:
        self.lse_base, self.returns, self.partial = declared, returns_lse, partial
        self.name = "declares"

    def run(self, inputs):
        res = ContextMutant.run(self, inputs)
        parts = {}
        if self.partial is not None:  # (declared base, returns an LSE): the whole result as a partial
            parts["whole"] = Partial(res.out, res.lse if self.partial[1] else None, self.partial[0])
        return LoweringResult(out=res.out, lse=res.lse if self.returns else None, partials=parts)


def test_the_declaration_is_validated_and_register_refuses_another_value():
    assert protocol_violations(OutputOnlyContext()) == [] and not returns_lse(OutputOnlyContext())
    assert returns_lse(lowerings.get("sdpa")) and returns_lse(lowerings.get("windowed_merge[eager]"))
    for bad in (10.0, "e", 0, True):
        lw = Declares(bad, True)
        problems = protocol_violations(lw)
        assert len(problems) == 1 and problems[0].startswith("'lse_base' must be math.e or 2.0") and \
            "or None when run returns no LSE" in problems[0] and problems[0].endswith(f"got {bad!r}"), problems
        with pytest.raises(Exception, match="'lse_base' must be math.e or 2.0"):
            lowerings.register(lw)
    assert protocol_violations(Declares(math.e, True)) == protocol_violations(Declares(2, True)) == []


@pytest.mark.parametrize("declared, returns_lse, partial, phrase", [
    (BASE_E, False, None, "declares: declared lse_base e but returned no LSE (lse=None): the LSE would go unchecked; "
                          "a kernel that computes no LSE declares lse_base = None"),
    (NO_LSE, True, None, "declares: declared lse_base None (no LSE) but returned an LSE: it would go unchecked"),
    (NO_LSE, False, (BASE_E, False), "partials['whole']: declared lse_base e but returned no LSE"),
    (NO_LSE, False, (NO_LSE, True), "partials['whole']: declared lse_base None (no LSE) but returned an LSE"),
    (NO_LSE, False, (7.0, True), "partials['whole'].lse_base is 7.0, expected math.e or 2.0, or None (no LSE)"),
])
def test_a_result_that_contradicts_its_declaration_fails(policy, declared, returns_lse, partial, phrase):
    out = run_case(Declares(declared, returns_lse, partial), _case(), policy, RunOptions())
    assert out.status == "fail" and len(out.failures) == 1 and phrase in out.failures[0], out.failures


def test_an_output_only_result_is_judged_alone_partials_too(policy):
    out = run_case(OutputOnlyContext(), _case(), policy, RunOptions(), lowerings.get("sdpa"))
    assert out.status == "pass", out.failures
    figs = out.main.figures
    assert figs["lse_checked"] is False and "lse_max_abs" not in figs and "lse" not in out.main.margins
    assert figs["out_ulp"] >= 0 and "yardstick_bound" in figs  # the output's criteria all applied
    both = run_case(Declares(NO_LSE, False, (NO_LSE, False)), _case(), policy, RunOptions())
    assert both.status == "pass" and [c.label for c in both.comparisons] == ["output", "partial whole"]
    assert all(c.figures["lse_checked"] is False for c in both.comparisons)
    checked = run_case(lowerings.get("context"), _case(), policy, RunOptions())
    assert "lse_checked" not in checked.main.figures and "lse_max_abs" in checked.main.figures


class WrongPartialB(WindowedMerge):
    """The eager windowed merge, output-only, its part B exposed without an LSE and scaled by 1.25."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name, self.lse_base = "output_only_merge", NO_LSE

    def run(self, inputs):
        res = super().run(inputs)
        b = res.partials["B"]
        wrong = Partial(b.out * 1.25, None, NO_LSE, b.window, future_block_keys_right=b.future_block_keys_right)
        return LoweringResult(out=res.out, lse=None, partials={**res.partials, "B": wrong})


def test_a_wrong_output_only_partial_is_caught(policy):
    out = run_case(WrongPartialB(form="eager"), _case(context_lens=[5, 17]), policy, RunOptions())
    assert out.status == "fail" and out.failures and all(f.startswith("partial B: ") for f in out.failures), \
        out.failures
    assert [c.label for c in out.comparisons if c.failures] == ["partial B"]


def test_an_output_only_mutant_with_a_wrong_output_is_caught(policy):
    lw = DropsTheLastKey()
    strategy = cases(lw, limits=Limits(max_batch=2, max_context=24))
    rep = check_lowering(lw, policy, strategy=strategy,
                         settings=profile_settings("ci", max_examples=10), opts=RunOptions(device="cpu"), flaky_runs=0)
    assert rep.status == "fail" and len(rep.failures) == 1 and not rep.lse_checked, rep.extra
    msgs = rep.failures[0].outcome.failures
    assert any(m.startswith("output: max |O - O_ref|") for m in msgs) and not any("LSE" in m for m in msgs), msgs
    assert "LSE unchecked" in lse_report.status_cell(rep.to_json(), "FAIL")
    control = check_lowering(OutputOnlyContext(), policy, strategy=strategy,
                             settings=profile_settings("ci", max_examples=10), opts=RunOptions(device="cpu"))
    assert control.status == "pass" and control.cases == 10 and not control.lse_checked, control.extra


def test_the_example_plugin_passes_and_every_report_says_lse_unchecked(tmp_path, capsys):
    code, out = _main(["check", "--plugin", EXAMPLE, "--lowering", "my_sdpa", "--lowering", "sdpa", "--max-examples",
                       "6", *TINY, "--device", "cpu", "--no-isolate", "--report", tmp_path], capsys)
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("my_sdpa "))
    assert "pass (LSE unchecked)" in row, out
    assert "LSE unchecked" not in next(line for line in out.splitlines() if line.startswith("sdpa "))
    data = json.loads((tmp_path / "parity.json").read_text())
    mine, other = data["lowerings"]["my_sdpa"], data["lowerings"]["sdpa"]
    assert mine["status"] == "pass" and mine["judged"] > 6 and mine["lse_checked"] is False
    assert "lse_checked" not in other  # written only when false
    assert mine["worst_figures"]["lse_checked"] is False
    summary = (tmp_path / "summary.md").read_text()
    assert "| my_sdpa | pass (LSE unchecked) |" in summary and "| sdpa | pass |" in summary
    assert "- `my_sdpa`: LSE unchecked: it declares no LSE" in summary and "`sdpa`: LSE unchecked" not in summary
    junit = (tmp_path / "junit.xml").read_text()
    assert ('name="my_sdpa" ' in junit and '<property name="lse_checked" value="false"/>' in junit
            and junit.count("<property ") == 1), junit
    code, listed = _main(["list", "--plugin", EXAMPLE], capsys)
    bases = [r.split()[2] for r in listed.splitlines() if r.startswith(("my_sdpa ", "sdpa "))]
    assert code == 0 and bases == ["none", "e"], listed


def test_the_pytest_report_says_lse_unchecked(pytester, restore_registry):
    """pytest's own junit XML records `parity_lse_checked` per test; the terminal summary's table says it (the
    session in process: a pytest subprocess costs its imports, seconds)."""
    pytester.makepyfile(test_other_repo='''
def test_parity(parity_lowering, parity_check):
    rep = parity_check(parity_lowering, max_examples=3)
    assert rep.lse_checked is (parity_lowering.name != "my_sdpa")
''')
    xml = pytester.path / "junit.xml"
    with not_an_xdist_worker():
        res = pytester.runpytest_inprocess(
            *plugin_args(), "--parity-plugin", str(EXAMPLE), "--parity-lowering", "my_sdpa", "--parity-lowering", "sdpa",
            "--parity-profile", "ci", "--parity-device", "cpu", f"--junitxml={xml}",
            *[("--parity-" + a[2:]) if a.startswith("--") else a for a in TINY], "-p", "no:cacheprovider")
    assert_outcomes(res, passed=2)
    res.stdout.fnmatch_lines(["*dflash-parity*", "my_sdpa*pass (LSE unchecked)*"])
    text = xml.read_text()
    assert '<property name="parity_lse_checked" value="false"' in text, text
    assert '<property name="parity_lse_checked" value="true"' in text, text
