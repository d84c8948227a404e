"""Issue 17, items 1-4: a merge gate that cannot be talked into passing, a policy that refuses absurd
bounds, and a check that never ends on a stale or silent verdict.

Two tables. GATE_ROWS: one adversarial change each to a copy of a real report pair (the same `check` run
twice on a plugin lowering, tiny shapes), the exit code of `dflash-parity gate` and the phrase that names
the reason. CHECK_ROWS: adversarial inputs to `check` / `repro` (a policy, a plugin mutant, a case), the
exit code and the phrase. Real runs happen once per module (`runs`), in process, `--no-isolate`; the
signal rows start real processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import lowerings
from lowerings import registry
from parity.front import cli
from parity.report import rundir
from strategies import check_cases, limit_overrides

ROOT = Path(__file__).resolve().parents[2]
TOML = (ROOT / "tolerances.toml").read_text()
TINY = ["--limit", "max_batch=2", "--limit", "max_context=20", "--limit", "head_dims=16", "--limit", "max_kv_heads=1",
        "--limit", "max_group=2", "--limit", "max_block=3", "--limit", "max_production_context=0"]
LOWERING = "pr_lowering"

# A pull request's lowering (the torch context lowering renamed), in one of several adversarial modes.
PLUGIN = '''import sys
import torch
from lowerings import LoweringResult, register
from lowerings.torch_emulation import Context

MODE = "{mode}"


class PR(Context):
    name = "pr_lowering"
    lse_base = None if MODE == "output-only" else Context.lse_base  # output-only: it returns no LSE

    def supports(self, case):
        if MODE == "decline-fp16" and case.dtype == "float16":
            return "declines fp16"
        if MODE == "decline-at-run":  # accepts a case when it is drawn, declines it when it is run
            key = case.to_json(indent=None)
            seen = self.__dict__.setdefault("seen", set())
            if key in seen:
                return "declined when run"
            seen.add(key)
        if MODE == "exit-supports":
            sys.exit(0)
        return super().supports(case)

    def run(self, inputs):
        if MODE == "exit-run":
            sys.exit(0)
        res = super().run(inputs)
        if MODE == "zeros":
            return LoweringResult(out=torch.zeros_like(res.out), lse=res.lse)
        if MODE in ("no-lse", "output-only"):
            return LoweringResult(out=res.out, lse=None)
        return res


register(PR())
'''
MODES = ("good", "zeros", "no-lse", "exit-run", "exit-supports", "decline-at-run", "decline-fp16", "output-only")


@contextlib.contextmanager
def _registry_restored():
    with registry.restored():
        yield


def _main(argv, capsys=None) -> tuple[int, str]:
    with _registry_restored():
        code = cli.main([str(a) for a in argv])
    if capsys is None:
        return code, ""
    out, err = capsys.readouterr()
    return code, out + err


def _check_argv(plugin: Path, report: Path, *extra) -> list:
    return ["check", "--plugin", plugin, "--lowering", LOWERING, "--max-examples", "6", *TINY, "--device", "cpu",
            "--no-isolate", "--quiet", "--report", report, *extra]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def plugins(work) -> dict[str, Path]:
    out = {}
    for mode in MODES:
        p = work / f"plugin_{mode.replace('-', '_')}.py"
        p.write_text(PLUGIN.format(mode=mode))
        out[mode] = p
    return out


@pytest.fixture(scope="module")
def runs(work, plugins) -> dict[str, Path]:
    """Report directories of real runs: the baseline, the same run again, the all-zeros lowering (fails),
    the lowering declining fp16, the all-zeros lowering under 1e300 bounds (allowed explicitly), the lowering
    returning its output alone (declared: `lse_base = None`)."""
    loose = work / "loose.toml"
    text = TOML
    for key in ("out_max_ulp = 8.0", "out_rel_l2 = 1.0e-2", "yardstick_factor = 2.0", "yardstick_floor_ulp = 2.0",
                "lse_abs = 1.0e-3"):
        text = text.replace(key, key.split(" = ")[0] + " = 1e300")
    loose.write_text(text)
    out = {}
    for name, mode, extra in (("base", "good", []), ("again", "good", []), ("zeros", "zeros", []),
                              ("fp16", "decline-fp16", []), ("output-only", "output-only", []),
                              ("loose", "zeros", ["--tolerances", loose, "--allow-loose-bounds"])):
        d = work / "runs" / name
        code, _ = _main(_check_argv(plugins[mode], d, *extra))
        assert code == (1 if name == "zeros" else 0), name
        out[name] = d
    return out


# ---- the gate table -------------------------------------------------------------------------------------

def _lw(r):
    return r["lowerings"][LOWERING]


def _set_bounds(r, key, value, source=None, reason=None, lowering=LOWERING):
    for b in r["policy"]["bounds"][lowering].values():
        b[key]["value"] = value
        if source is not None:
            b[key]["source"] = source
        if reason is not None:
            b[key]["reason"] = reason


def _fewer(r):
    _lw(r).update(cases=1, judged=1, passed=1)


def _judged_none(r):
    _lw(r).update(unsupported=_lw(r)["cases"], judged=0, passed=0, classes={})


def _new_lowering_looser(r):
    r["lowerings"]["pr_lowering_v2"] = json.loads(json.dumps(_lw(r)))
    r["policy"]["bounds"]["pr_lowering_v2"] = json.loads(json.dumps(r["policy"]["bounds"][LOWERING]))
    _set_bounds(r, "lse_abs", 0.04, source='lowering."pr_lowering_v2".bfloat16', reason="measured", lowering="pr_lowering_v2")


FA2 = 'kernel."BatchPrefillWithPagedKVCacheKernel".bfloat16'


def _kernel_entry_looser(r):
    r["policy"]["overrides"][FA2]["values"]["lse_abs"] = 0.04  # under the ceiling, 20x the measured bound


def _kernel_entry_new_key(r):
    r["policy"]["overrides"][FA2]["values"]["out_rel_l2"] = 0.05  # a key the baseline's entry left to the defaults


def _kernel_entry_key_the_baseline_predates(r):
    r["policy"]["overrides"][FA2]["values"]["yardstick_score_rel"] = 9e-5  # looser than the entry's 1.3e-5


def _baseline_predates_score_rel(r):  # a baseline recorded before the key existed: no such key anywhere
    for per_dtype in r["policy"]["bounds"].values():
        for keys in per_dtype.values():
            keys.pop("yardstick_score_rel", None)
    for e in r["policy"]["overrides"].values():
        e["values"].pop("yardstick_score_rel", None)


def _kernel_entry_out_score_looser(r):
    r["policy"]["overrides"][FA2]["values"]["out_score_rel"] = 9e-5  # looser than the entry's 1.3e-5


def _baseline_predates_out_score_rel(r):  # a baseline recorded before `out_score_rel` existed
    for per_dtype in r["policy"]["bounds"].values():
        for keys in per_dtype.values():
            keys.pop("out_score_rel", None)
    for e in r["policy"]["overrides"].values():
        e["values"].pop("out_score_rel", None)


def _kernel_entry_new(r):
    r["policy"]["overrides"]['kernel."my_kernel".bfloat16'] = {"values": {"out_max_ulp": 30.0}, "reason": "measured",
                                                             "measured_in": []}


def _unavailable(r):
    _lw(r).update(status="unavailable", reason="needs a GPU", cases=0, judged=0, passed=0, classes={})


# (id, new report from: a run or (run, edit of new), edit of the baseline, extra argv, exit code, phrase)
GATE_ROWS = [
    ("honest: the same run twice", "again", None, None, [], 0, "dflash-parity gate: PASS"),
    ("override without a reason, 2% looser", "again",
     lambda r: _set_bounds(r, "out_rel_l2", 0.0102, source=f'lowering."{LOWERING}".bfloat16', reason=""),
     None, [], 1, "**override-without-reason**"),
    ("bound got looser (with a reason)", "again",
     lambda r: _set_bounds(r, "lse_abs", 2e-3, source=f'lowering."{LOWERING}".bfloat16', reason="measured"),
     None, [], 1, "lse_abs got looser: 0.001"),
    ("every bound 1e300 in the report", "again",
     lambda r: [_set_bounds(r, k, 1e300) for k in ("out_max_ulp", "out_rel_l2", "lse_abs")], None, [], 1,
     "**loose-bounds**"),
    ("all zeros under 1e300 bounds (check --allow-loose-bounds)", "loose", None, None, [], 1, "past the sanity ceiling"),
    ("all zeros under 1e300 bounds, looser-bounds accepted only", "loose", None, None,
     ["--accept", "looser-bounds"], 1, "**loose-bounds**"),
    ("new policy sets max_margin_growth 1e12", "again", lambda r: r["policy"].update(max_margin_growth=1e12), None,
     [], 1, "**gate-settings**"),
    ("new policy sets max_margin_growth 1e12 and the margin grows", "again",
     lambda r: (r["policy"].update(max_margin_growth=1e12), _lw(r).update(worst_margin=0.95)), None,
     ["--accept", "gate-settings"], 1, "**margin-growth**"),
    ("kernel entry loosened (it sets the bounds of whichever cases ran that kernel)", "again", _kernel_entry_looser,
     None, [], 1, "lse_abs got looser: 0.002 (the baseline's same entry)"),
    ("a key added to a kernel entry, looser than the defaults", "again", _kernel_entry_new_key, None, [], 1,
     "out_rel_l2 got looser: 0.01 (the baseline's defaults (a key new to this kernel entry))"),
    ("a key the baseline predates, set in a kernel entry", "again", _kernel_entry_key_the_baseline_predates,
     _baseline_predates_score_rel, [], 1, "yardstick_score_rel got looser: 0 (the baseline's defaults (a key new to "
     "this kernel entry), where this key did not exist: 0)"),
    ("out_score_rel, a key the baseline predates, set in a kernel entry", "again", _kernel_entry_out_score_looser,
     _baseline_predates_out_score_rel, [], 1, "out_score_rel got looser: 0 (the baseline's defaults (a key new to "
     "this kernel entry), where this key did not exist: 0)"),
    ("new kernel entry looser than the defaults", "again", _kernel_entry_new, None, [], 1,
     "out_max_ulp got looser: 8 (the baseline's defaults (a new kernel entry))"),
    ("checked 1 case where the baseline checked 6", "again", _fewer, None, [], 1, "**fewer-cases**"),
    ("judged none: every case unsupported", "again", _judged_none, None, [], 1, "**nothing-judged**"),
    ("supports() declines fp16: classes vanish", "fp16", None, None, [], 1, "**class-removed**"),
    ("lowering disappeared", "again", lambda r: r["lowerings"].pop(LOWERING), None, [], 1, "**lowering-removed**"),
    ("lowering unavailable now", "again", _unavailable, None, [], 1, "stopped being checked"),
    ("--no-hardening", "again", lambda r: r["settings"].update(hardening=False), None, [], 1, "**hardening-off**"),
    ("kernel names never profiled", "again", lambda r: r["settings"].update(kernel_names_every=0), None, [], 1,
     "**hardening-off**"),
    ("--no-isolate where the baseline isolated", "again", None, lambda r: r["settings"].update(isolation=True), [], 1,
     "**isolation-off**"),
    ("another profile", "again", lambda r: r["settings"].update(profile="dev", derandomized=False), None, [], 1,
     "**settings-changed**"),
    ("narrower --limit", "again", lambda r: r["settings"].update(limits=["dtypes=bfloat16"]), None, [], 1,
     "**settings-changed**"),
    ("fail | fail | ok: baseline failed, new is all zeros", "zeros", None, "zeros", [], 1, "fails now (baseline: fail)"),
    ("baseline failed, new passes", "again", None, "zeros", [], 1, "**baseline-failed**"),
    ("baseline failed, accepted explicitly", "again", None, "zeros", ["--accept", "baseline-failed"], 0, "Accepted"),
    ("all zeros against a passing baseline", "zeros", None, None, ["--accept", ",".join(
        ["baseline-failed", "fewer-cases", "class-removed"])], 1, "passed in the baseline and fails now"),
    ("interrupted new run", "again", lambda r: r.update(verdict="interrupted"), None, [], 1, "was interrupted"),
    ("margin grew 0.22 -> 0.95", "again", lambda r: _lw(r).update(worst_margin=0.95), None, [], 1, "**margin-growth**"),
    ("margin grew, accepted", "again", lambda r: _lw(r).update(worst_margin=0.95), None,
     ["--accept", "margin-growth"], 0, "Accepted (`--accept margin-growth`)"),
    ("LSE dropped: the lowering returns none now", "output-only", None, None, [], 1, "**lse-dropped**: `pr_lowering`"),
    ("LSE dropped, accepted", "output-only", None, None, ["--accept", "lse-dropped"], 0, "(`--accept lse-dropped`)"),
    ("LSE gained: an output-only baseline", "again", None, "output-only", [], 0, "dflash-parity gate: PASS"),
    ("margin grew, --max-margin-growth 1 from the command line", "again", lambda r: _lw(r).update(worst_margin=0.95),
     None, ["--max-margin-growth", "1"], 0, "growth up to 1 (--max-margin-growth)"),
    ("renamed lowering with a looser bound", "again", _new_lowering_looser, None, [], 1,
     "(the baseline's defaults (a lowering new to the gate)"),
    ("stale: --not-before after the run", "again", None, None, ["--not-before", "2999-01-01T00:00:00Z"], 1,
     "the new report is stale"),
    ("stale: another --commit", "again", lambda r: r.update(git={"commit": "a" * 40, "dirty": False}), None,
     ["--commit", "b" * 12], 1, "not --commit bbbbbbbbbbbb"),
    ("--commit named, none recorded", "again", lambda r: r.update(git=None), None, ["--commit", "b" * 12], 1,
     "unknown (not recorded)"),
    ("new directory still marked IN_PROGRESS", "again", "in-progress", None, [], 1, "is marked in progress"),
    ("report version 1", "again", lambda r: r.update(version=1), None, [], 2, "report version 1 records neither"),
    ("new report without settings", "again", lambda r: r.pop("settings"), None, [], 2, "settings: missing"),
    ("gate --tolerances (the policy under review)", "again", None, None, ["--tolerances", ROOT / "tolerances.toml"], 2,
     "--tolerances: the gate reads no policy file"),
    ("unknown --accept rule", "again", None, None, ["--accept", "everything"], 2, "--accept: unknown rule 'everything'"),
    ("bad --not-before", "again", None, None, ["--not-before", "yesterday"], 2, "--not-before: an ISO-8601 time"),
    ("bad --commit", "again", None, None, ["--commit", "xyz"], 2, "--commit: a git commit SHA"),
]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(d: Path, fn) -> None:
    data = json.loads((d / "parity.json").read_text())
    fn(data)
    (d / "parity.json").write_text(json.dumps(data))


@pytest.mark.parametrize("new_from,edit_new,base_from,argv,code,phrase",
                         [pytest.param(*r[1:], id=r[0]) for r in GATE_ROWS])
def test_gate_fails_closed_naming_the_reason(runs, tmp_path, capsys, new_from, edit_new, base_from, argv, code, phrase):
    base = _copy(runs[base_from if isinstance(base_from, str) else "base"], tmp_path / "base")
    new = _copy(runs[new_from], tmp_path / "new")
    if callable(base_from):
        _edit(base, base_from)
    if edit_new == "in-progress":
        rundir.begin(new, "feedbeef", "2026-12-01T00:00:00+00:00")
    elif edit_new is not None:
        _edit(new, edit_new)
    got, out = _main(["gate", "--baseline", base, new, *argv], capsys)
    assert got == code, out
    assert phrase in out, out
    assert "Traceback" not in out
    if code != 2:
        md = (new / "gate.md").read_text()
        assert md.splitlines()[0] == f"## dflash-parity gate: {'PASS' if code == 0 else 'FAIL'}"
        assert phrase in md


def test_the_report_records_what_was_checked(runs, plugins):
    """Item 1: the effective policy (each bound, its source table, its reason), the settings, the plugin
    hashes, counts per lowering and class, the run's identity and times, its verdict."""
    import hashlib

    data = json.loads((runs["base"] / "parity.json").read_text())
    assert data["version"] == 2 and data["verdict"] == "pass"
    assert data["run_id"] and data["started"] <= data["finished"]
    st = data["settings"]
    assert st["profile"] == "ci" and st["max_examples"] == 6 and st["hardening"] and not st["isolation"]
    assert st["limits"] == [x for x in TINY if x != "--limit"] and st["device"] == "cpu" and st["seed"] is None
    pol = data["policy"]
    assert pol["sha256"] == hashlib.sha256((ROOT / "tolerances.toml").read_bytes()).hexdigest()
    b = pol["bounds"][LOWERING]["bfloat16"]["out_max_ulp"]
    assert b == {"value": 8.0, "source": "defaults.bfloat16", "reason": b["reason"]} and "seed 002" in b["reason"]
    over = pol["overrides"]['kernel."BatchPrefillWithPagedKVCacheKernel".bfloat16']  # the measured fa2 entry
    assert over["values"] == {"lse_abs": 2e-3, "lse_rel": 2.5e-3, "yardstick_score_rel": 1.3e-5,
                              "out_score_rel": 1.3e-5} and "fa2" in over["reason"] and over["measured_in"]
    assert data["plugins"] == [{"path": str(plugins["good"].resolve()),
                                "sha256": hashlib.sha256(plugins["good"].read_bytes()).hexdigest()}]
    v = data["lowerings"][LOWERING]
    boundaries = check_cases(lowerings.get("context"), "cpu", profile="ci",  # PR is context renamed
                             overrides=limit_overrides([x for x in TINY if x != "--limit"])).boundaries
    assert v["judged"] == v["cases"] == sum(c["cases"] for c in v["classes"].values()) == 6 + len(boundaries)
    loose = json.loads((runs["loose"] / "parity.json").read_text())
    assert loose["settings"]["allow_loose_bounds"] and loose["policy"]["allow_loose_bounds"]


# ---- check, repro, pytest: the run's own verdict ------------------------------------------------------------

def _toml(tmp: Path, text: str) -> Path:
    p = tmp / "t.toml"
    p.write_text(text)
    return p


def _planted(tmp: Path) -> Path:
    """A report directory with a planted failure file whose case has scale 1e300 (a non-finite oracle)."""
    from oracle import Case

    case = Case(context_lens=(3,), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=16, page_size=4,
                pages=((0,),), num_pages=2, scale=1e300)
    d = tmp / "planted"
    (d / "failures").mkdir(parents=True)
    (d / "failures" / f"{LOWERING}-1.json").write_text(json.dumps({"lowering": LOWERING, "case": case.to_json_dict()}))
    return d


def _fp16_ulp(value: float) -> str:
    head, sep, tail = TOML.partition("[defaults.float16]")
    return head + sep + tail.replace("out_max_ulp = 8.0", f"out_max_ulp = {value}", 1)


REASONLESS = TOML + '\n[lowering."sdpa".bfloat16]\nout_max_ulp = 4.0\n'
CHECK_ROWS = [
    # (id, argv builder (tmp, plugins) -> argv, exit code, phrase, verdict in parity.json or None)
    ("override without a reason", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances", _toml(t, REASONLESS)), 2,
     "lowering.'sdpa'.bfloat16.reason: missing", None),
    ("a bound of 1e300", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances", _toml(
        t, TOML.replace("lse_abs = 1.0e-3", "lse_abs = 1e300", 1))), 2, "lse_abs: 1e+300 is past the sanity ceiling", None),
    ("relative L2 0.5", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances", _toml(
        t, TOML.replace("out_rel_l2 = 1.0e-2", "out_rel_l2 = 0.5", 1))), 2, "out_rel_l2: 0.5 is past the sanity ceiling", None),
    ("300 fp16 ulp", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances", _toml(t, _fp16_ulp(300.0))), 2,
     "float16.out_max_ulp: 300 is past the sanity ceiling 256", None),
    ("200 fp16 ulp is under the fp16 ceiling", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances",
                                                                        _toml(t, _fp16_ulp(200.0))), 0, "", "pass"),
    ("[gate] max_margin_growth 1e12", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances", _toml(
        t, TOML.replace("max_margin_growth = 0.25", "max_margin_growth = 1e12"))), 2,
     "gate.max_margin_growth: 1e+12 is past the sanity ceiling", None),
    ("empty reason", lambda t, p: _check_argv(p["good"], t / "r", "--tolerances", _toml(
        t, REASONLESS.replace("out_max_ulp = 4.0\n", "reason = \"  \"\nout_max_ulp = 4.0\n"))), 2, "reason: missing", None),
    ("sys.exit(0) in supports()", lambda t, p: _check_argv(p["exit-supports"], t / "r"), 1,
     "supports() raised SystemExit 0", "fail"),
    ("sys.exit(0) in supports(), isolated", lambda t, p: [a for a in _check_argv(p["exit-supports"], t / "r")
                                                          if a != "--no-isolate"], 1, "supports() raised SystemExit 0", "fail"),
    ("sys.exit(0) in run() under --no-isolate", lambda t, p: _check_argv(p["exit-run"], t / "r"), 1,
     "raised SystemExit(0): a lowering must return", "fail"),
    ("lse=None with a declared LSE base", lambda t, p: _check_argv(p["no-lse"], t / "r"), 1,
     "declared lse_base 2 but returned no LSE", "fail"),
    ("every case unsupported", lambda t, p: _check_argv(p["decline-at-run"], t / "r"), 1, "nothing was judged",
     "nothing judged"),
    ("every case unsupported, expected", lambda t, p: _check_argv(p["decline-at-run"], t / "r", "--allow-nothing-judged"),
     0, "accepted (--allow-nothing-judged)", "nothing judged"),
    ("a lowering that cannot run here", lambda t, p: ["check", "--lowering", "context[flashinfer-fa2]", "--device", "cpu",
                                                      "--quiet", "--report", t / "r"], 1, "nothing was judged", "nothing judged"),
    ("planted failure file with scale 1e300", lambda t, p: _check_argv(p["good"], _planted(t)), 2,
     "scale: the oracle is not finite", None),
]


@pytest.mark.parametrize("argv,code,phrase,verdict", [pytest.param(*r[1:], id=r[0]) for r in CHECK_ROWS])
def test_check_never_ends_on_a_silent_verdict(tmp_path, capsys, plugins, argv, code, phrase, verdict):
    got, out = _main(argv(tmp_path, plugins), capsys)
    assert got == code, out
    assert phrase in out, out
    assert "Traceback" not in out
    report = next((d for d in (tmp_path / "r", tmp_path / "planted") if d.exists()), None)
    if verdict is None:
        assert report is None or not (report / "parity.json").exists()
    else:
        data = json.loads((report / "parity.json").read_text())
        assert data["verdict"] == verdict
        assert rundir.in_progress(report) is None


def test_check_cuda_without_a_gpu_judges_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, out = _main(["check", "--lowering", "sdpa", "--device", "cuda", "--quiet", "--report", tmp_path], capsys)
    assert code == 1 and "nothing was judged" in out
    assert "# dflash-parity: NOTHING JUDGED" in (tmp_path / "summary.md").read_text()
    assert 'name="nothing judged"><failure' in (tmp_path / "junit.xml").read_text()
    code, out = _main(["gate", "--baseline", tmp_path, tmp_path], capsys)
    assert code == 1 and "**baseline-failed**" in out and "**nothing-judged**" in out


def test_repro_of_a_non_finite_oracle_is_bad_input(tmp_path, capsys):
    from oracle import Case

    case = Case(context_lens=(3,), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=16, page_size=4,
                pages=((0,),), num_pages=2, kv_dtype="float8_e4m3fn", v_scale=1e300)
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"lowering": "sdpa", "case": case.to_json_dict()}))
    code, out = _main(["repro", f, "--device", "cpu"], capsys)
    assert code == 2 and f"{f}: v_scale: the oracle is not finite" in out, out


def test_unsatisfiable_supports_is_nothing_judged_not_a_traceback():
    """supports() that admits no drawable case: hypothesis gives up (Unsatisfiable); the lowering judged
    nothing and says why."""
    from hypothesis import strategies as st

    from oracle import Case
    from parity.engine import policy
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import profile_settings

    case = Case(context_lens=(3,), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=16, page_size=4,
                pages=((0,),), num_pages=2)
    rep = check_lowering(lowerings.get("sdpa"), policy.load(), strategy=st.just(case).filter(lambda c: False),
                         settings=profile_settings("ci", max_examples=2), opts=RunOptions())
    assert rep.status == "pass" and rep.cases == 0 and "nothing judged" in rep.reason


# ---- a run cut short leaves no passing verdict ----------------------------------------------------------

def test_a_full_disk_leaves_no_passing_verdict(runs, plugins, tmp_path, capsys, monkeypatch):
    """The previous run's passing parity.json moves to previous/ when the run starts; the disk fills
    while the verdict is written: no parity.json, the directory stays marked, the gate refuses it."""
    from parity.report import files as report

    d = _copy(runs["base"], tmp_path / "r")
    real = report.atomic_write

    def full(path, text):
        if Path(path).name == "parity.json":
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(report, "atomic_write", full)
    code, out = _main(_check_argv(plugins["good"], d), capsys)  # one message naming the directory, exit 2
    assert code == 2 and "No space left on device" in out and "no parity.json was written" in out, out
    monkeypatch.undo()
    assert not (d / "parity.json").exists() and (d / "previous" / "parity.json").exists()
    code, out = _main(["gate", "--baseline", runs["base"], d], capsys)
    assert code == 1 and "is marked in progress" in out


def _start(argv, report: Path) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "parity.front.cli", *map(str, argv)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _wait_for(lines: list[str], names, timeout=120.0) -> None:  # each judged a case: "  NAME: N cases, ..."
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(
            any(ln.startswith(f"  {n}: ") and " cases, " in ln for ln in list(lines)) for n in names):
        time.sleep(0.1)


@pytest.mark.parametrize("sig,jobs", [pytest.param(signal.SIGTERM, 2, id="SIGTERM to a --jobs 2 parent"),
                                      pytest.param(signal.SIGHUP, 1, id="SIGHUP to a serial check")])
def test_sigterm_and_sighup_are_handled_as_sigint(runs, tmp_path, capsys, sig, jobs):
    """The signal stops the run, children included, and writes the partial report (verdict interrupted,
    exit 128+n); the previous passing verdict is in previous/, and the gate refuses the partial one."""
    d = _copy(runs["base"], tmp_path / "r")
    names = ["decode_rows", "sdpa"] if jobs > 1 else ["decode_rows"]
    argv = ["check", *[a for n in names for a in ("--lowering", n)], "--max-examples", "5000", "--no-isolate",
            "--device", "cpu", "--jobs", jobs, *TINY, "--report", d]
    proc, lines = _start(argv, d)
    _wait_for(lines, names)
    os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    time.sleep(0.2)
    out = "".join(lines)
    assert proc.returncode == 128 + sig, out
    data = json.loads((d / "parity.json").read_text())
    assert data["verdict"] == "interrupted", out
    for n in names:
        notes = data["lowerings"][n]["notes"]
        assert any("interrupted after" in x for x in notes), (n, notes, out[-3000:])
    assert json.loads((d / "previous" / "parity.json").read_text())["verdict"] == "pass"
    assert rundir.in_progress(d) is None
    code, text = _main(["gate", "--baseline", runs["base"], d], capsys)
    assert code == 1 and "was interrupted" in text


# ---- random draws: never cry wolf, still catch a real drop ------------------------------------------------

def test_random_draws_compare_within_binomial_spread(runs, tmp_path, capsys):
    """Two honest runs of a random profile draw different cases (here: a class of one case in the baseline
    drew none, its case went to another class): the gate passes them. A drop in judged cases beyond 5
    sigma, or a class whose absence by chance is rarer than 1e-6, still fails."""
    from parity.report.gate_lowerings import class_gone as _class_gone, fewer_cases as _fewer

    def random_profile(r):
        r["settings"].update(profile="dev", derandomized=False, seed=None)

    def other_draws(r):
        random_profile(r)
        classes = _lw(r)["classes"]
        gone, kept = sorted(classes, key=lambda k: classes[k]["cases"])[:2]
        classes[kept]["cases"] += classes.pop(gone)["cases"]

    base, new = _copy(runs["base"], tmp_path / "a"), _copy(runs["again"], tmp_path / "b")
    _edit(base, random_profile)
    _edit(new, other_draws)
    code, out = _main(["gate", "--baseline", base, new], capsys)
    assert code == 0, out
    o = {"cases": 1000, "unsupported": 300}
    assert _fewer(o, {"cases": 1000, "unsupported": 360}, strict=False) is None  # 700 -> 640: 4.1 sigma
    assert "5 sigma" in _fewer(o, {"cases": 1000, "unsupported": 380}, strict=False)  # 700 -> 620: 5.5 sigma
    assert "drew 999" in _fewer(o, {"cases": 999, "unsupported": 0}, strict=False)
    assert _fewer(o, {"cases": 1000, "unsupported": 301}, strict=True) == "judged 699 case(s), the baseline 700"
    assert _class_gone("c", 3, 60, 60, strict=False) is None  # (57/60)^60 = 4.6e-2
    assert "chance" in _class_gone("c", 20, 60, 60, strict=False)  # (40/60)^60 = 2.7e-11


def test_an_ignored_sighup_stays_ignored():
    """`nohup` ignores SIGHUP: the check keeps it ignored, and takes SIGTERM and SIGINT."""
    from parity.exec import interrupt

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupt.installed() as handler:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)
