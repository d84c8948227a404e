"""The CLI end to end, in process: check, repro, gate, list, and the bad-input table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lowerings
from lowerings import registry
from oracle import Case, InvalidInput, attention, materialize
from parity.front import cli
from strategies import check_cases, limit_overrides

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin_window_off_by_one.py"


pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py


def run(argv, capsys):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_passes_and_writes_reports(tmp_path, capsys):
    code, out, err = run(["check", "--lowering", "sdpa", "--lowering", "context", "--max-examples", "8",
                          "--report", tmp_path, "--quiet", "--device", "cpu"], capsys)
    assert code == 0, out + err
    data = json.loads((tmp_path / "parity.json").read_text())
    assert data["schema"] == "dflash-parity/report" and data["version"] == 2 and data["verdict"] == "pass"
    assert set(data["lowerings"]) == {"sdpa", "context"}
    for name, v in data["lowerings"].items():  # 8 drawn cases after the boundary cases, run first
        n = 8 + len(check_cases(lowerings.get(name), "cpu", profile="ci").boundaries)
        assert v["status"] == "pass" and v["cases"] == n and v["calls_checked"] == n
        assert sum(v["drawn"]["context"].values()) == n and v["drawn"]["context"].get("4097-32768", 0) >= 1
    assert "<testsuite" in (tmp_path / "junit.xml").read_text()
    assert "# dflash-parity: PASS" in (tmp_path / "summary.md").read_text()
    # readable: a case's lengths and each page-table row on one line, the rest indented
    lens = [ln for ln in (tmp_path / "parity.json").read_text().splitlines() if '"context_lens": [' in ln]
    assert lens and all(ln.rstrip(",").endswith("]") for ln in lens)
    assert "context" in out and "pass" in out


def test_plugin_mutant_fails_shrinks_and_repro_fails_the_same_way(tmp_path, capsys):
    code, out, err = run(["check", "--plugin", PLUGIN, "--lowering", "my_windowed_merge", "--report", tmp_path,
                          "--quiet", "--device", "cpu"], capsys)
    assert code == 1, out + err
    failure = tmp_path / "failures" / "my_windowed_merge-1.json"
    saved = json.loads(failure.read_text())
    case = Case.from_json_dict(saved["case"])
    # Shrunk: one request, the smallest block and context that still show a window one key too wide.
    assert case.batch_size == 1 and case.block_size <= 2 and max(case.context_lens) <= 2, case.short()
    assert case.window[0] >= 0
    assert "@example(case=Case.from_json_dict(" in out
    assert any("ulp of max|O_ref|" in m for m in saved["failures"])
    summary = (tmp_path / "summary.md").read_text()
    assert "FAIL" in summary and "dflash-parity repro" in summary
    registry.unregister("my_windowed_merge")
    code, out, err = run(["repro", failure, "--plugin", PLUGIN, "--device", "cpu"], capsys)
    assert code == 1
    assert "FAIL" in out and "ulp of max|O_ref|" in out
    # A second check replays the saved failure first: it still fails, without drawing new cases.
    registry.unregister("my_windowed_merge")
    code, out, err = run(["check", "--plugin", PLUGIN, "--lowering", "my_windowed_merge", "--report", tmp_path,
                          "--quiet", "--device", "cpu"], capsys)
    assert code == 1 and "a saved failure still fails" in out


def test_gate_passes_on_same_code_and_fails_on_margin_growth(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        code, _, _ = run(["check", "--lowering", "decode_rows", "--max-examples", "6", "--report", d, "--quiet",
                          "--device", "cpu"], capsys)
        assert code == 0
    code, out, _ = run(["gate", "--baseline", a, b], capsys)
    assert code == 0, out
    assert "PASS" in (b / "gate.md").read_text()
    # The same report with one lowering's worst error taken from 2 to 7 ulps under its 8-ulp bound.
    data = json.loads((b / "parity.json").read_text())
    base = json.loads((a / "parity.json").read_text())
    base["lowerings"]["decode_rows"].update(worst_margin=2 / 8, worst_ulp=2.0)
    data["lowerings"]["decode_rows"].update(worst_margin=7 / 8, worst_ulp=7.0)
    (a / "parity.json").write_text(json.dumps(base))
    (b / "parity.json").write_text(json.dumps(data))
    code, out, _ = run(["gate", "--baseline", a, b], capsys)
    assert code == 1
    assert "grew from 0.25 to 0.88" in out
    # A lowering that disappears fails the gate too.
    del data["lowerings"]["decode_rows"]
    (b / "parity.json").write_text(json.dumps(data))
    code, out, _ = run(["gate", "--baseline", a, b], capsys)
    assert code == 1 and "disappeared" in out


def test_list_says_where_each_runs(capsys):
    code, out, _ = run(["list", "--device", "cpu"], capsys)
    assert code == 0
    for name in ("sdpa", "context", "decode_rows", "windowed_merge[eager]", "hybrid_paged"):
        assert name in out


# ---- the bad-input table -------------------------------------------------------------------------------

GOOD_CASE = Case(context_lens=(5,), block_size=2, num_q_heads=2, num_kv_heads=1, head_dim=16, page_size=4,
                 pages=((0, 1),), num_pages=3)


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def _case_text(**changes) -> str:
    d = GOOD_CASE.to_json_dict()
    d.update(changes)
    return json.dumps({"lowering": "sdpa", "case": d})


PLUGIN_RAISES = "raise RuntimeError('boom')\n"
PLUGIN_NOTHING = "x = 1\n"
PLUGIN_DUP = "import lowerings\nfrom lowerings.torch_emulation import Sdpa\nlowerings.register(Sdpa())\n"
PLUGIN_NOT_PROTOCOL = "import lowerings\nclass X:\n    name = 'x'\nlowerings.register(X())\n"
TOML_HEAD = open(ROOT / "tolerances.toml").read()

BAD_CLI = [
    # (id, argv builder, expected fragment)
    ("unknown lowering", lambda t: ["check", "--lowering", "nope", "--report", t / "r"], "unknown lowering 'nope'"),
    ("max-examples zero", lambda t: ["check", "--max-examples", "0"], "--max-examples must be a positive integer"),
    ("max-examples text", lambda t: ["check", "--max-examples", "many"], "--max-examples must be a positive integer"),
    ("negative seed", lambda t: ["check", "--seed", "-3"], "--seed must be an integer >= 0"),
    ("kernel-names-every negative", lambda t: ["check", "--kernel-names-every", "-1"], "--kernel-names-every must be an integer >= 0"),
    ("unknown profile", lambda t: ["check", "--profile", "fast"], "invalid choice: 'fast'"),
    ("unknown device", lambda t: ["check", "--device", "tpu"], "invalid choice: 'tpu'"),
    ("plugin missing", lambda t: ["list", "--plugin", t / "missing.py"], "missing.py: file not found"),
    ("plugin raises", lambda t: ["list", "--plugin", _write(t, "p1.py", PLUGIN_RAISES)], "raised RuntimeError on import: boom"),
    ("plugin registers nothing", lambda t: ["list", "--plugin", _write(t, "p2.py", PLUGIN_NOTHING)], "registered no lowering"),
    ("plugin duplicate name", lambda t: ["list", "--plugin", _write(t, "p3.py", PLUGIN_DUP)], "lowering 'sdpa': is already registered"),
    ("plugin not a lowering", lambda t: ["list", "--plugin", _write(t, "p4.py", PLUGIN_NOT_PROTOCOL)], "does not satisfy lowerings.protocol.Lowering"),
    ("case file missing", lambda t: ["repro", t / "none.json"], "none.json: case file not found"),
    ("case malformed JSON", lambda t: ["repro", _write(t, "c1.json", "{not json")], "not valid JSON"),
    ("case unknown version", lambda t: ["repro", _write(t, "c2.json", _case_text(version=99))], "version: this dflash-parity reads case formats 1, 2, 3, got 99"),
    ("case unknown field", lambda t: ["repro", _write(t, "c3.json", _case_text(colour="red"))], "colour: unknown case field"),
    ("case Hq not multiple", lambda t: ["repro", _write(t, "c4.json", _case_text(num_q_heads=3, num_kv_heads=2))], "num_q_heads: must be a multiple of num_kv_heads=2"),
    ("case page out of range", lambda t: ["repro", _write(t, "c5.json", _case_text(pages=[[0, 7]]))], "page ids must lie in the pool [0, num_pages=3)"),
    ("case context too long", lambda t: ["repro", _write(t, "c6.json", _case_text(context_lens=[50]))], "needs 13 pages of 4, got 2"),
    ("case page owned twice", lambda t: ["repro", _write(t, "c7.json", _case_text(context_lens=[1, 1], pages=[[0], [0]], batch_size=2))], "page 0 is already owned by request 0"),
    ("case names no lowering", lambda t: ["repro", _write(t, "c8.json", json.dumps(GOOD_CASE.to_json_dict()))], "names no lowering; pass --lowering"),
    ("tolerances missing", lambda t: ["list", "--tolerances", t / "none.toml"], "tolerance file not found"),
    ("tolerances unknown key", lambda t: ["list", "--tolerances", _write(t, "t1.toml", TOML_HEAD.replace("lse_abs = 1.0e-3", "lse_abs = 1.0e-3\nlse_relative = 2", 1))], "defaults.bfloat16.lse_relative: unknown key"),
    ("tolerances negative", lambda t: ["list", "--tolerances", _write(t, "t2.toml", TOML_HEAD.replace("out_max_ulp = 8.0", "out_max_ulp = -8.0", 1))], "out_max_ulp: a finite positive number, got -8.0"),
    ("tolerances non-numeric", lambda t: ["list", "--tolerances", _write(t, "t3.toml", TOML_HEAD.replace("out_rel_l2 = 1.0e-2", "out_rel_l2 = \"small\"", 1))], "out_rel_l2: a number, got 'small'"),
    ("tolerances unknown lowering", lambda t: ["list", "--tolerances", _write(t, "t4.toml", TOML_HEAD + "\n[lowering.\"nope\".bfloat16]\nreason = \"measured\"\nout_max_ulp = 4.0\n")], "lowering.'nope': no such lowering"),
    ("tolerances bad TOML", lambda t: ["list", "--tolerances", _write(t, "t5.toml", "[defaults\n")], "not valid TOML"),
    ("gate baseline missing", lambda t: ["gate", "--baseline", t / "old", t], "no parity.json there"),
]


@pytest.mark.parametrize("argv,fragment", [pytest.param(a, f, id=i) for i, a, f in BAD_CLI])
def test_bad_input_exits_2_with_one_clear_message(tmp_path, capsys, argv, fragment):
    code, out, err = run(argv(tmp_path), capsys)
    assert code == 2, (out, err)
    assert fragment in err, err
    assert "Traceback" not in err + out
    assert not (tmp_path / "r" / "parity.json").exists()  # no report written, not even half


def test_bad_tensors_handed_to_the_oracle_name_the_tensor():
    x = materialize(GOOD_CASE)
    bad = materialize(GOOD_CASE)
    bad.q = x.q.float()
    with pytest.raises(InvalidInput, match=r"^q: dtype torch.bfloat16 for this case, got torch.float32"):
        attention(bad)
    bad = materialize(GOOD_CASE)
    bad.k_pool = x.k_pool[:, :2]
    with pytest.raises(InvalidInput, match=r"^k_pool: shape \(3, 4, 1, 16\)"):
        attention(bad)
    bad = materialize(GOOD_CASE)
    bad.page_table = x.page_table.float()
    with pytest.raises(InvalidInput, match=r"^page_table: dtype int32 or int64"):
        attention(bad)
    with pytest.raises(InvalidInput, match=r"^key_mask: broadcastable"):
        attention(x, key_mask=torch.ones((2, 2, 2, 3), dtype=torch.bool))
    with pytest.raises(InvalidInput, match=r"^window: a pair"):
        attention(x, window=(-2, 0))
    with pytest.raises(InvalidInput, match=r"^device: 'cuda' was asked for|^device:"):
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: the missing-device error cannot show")
        materialize(GOOD_CASE, "cuda")


def test_check_in_a_fresh_process_runs_the_triton_lowering(tmp_path):
    """The README's main job path, as a user runs it: a new process with no conftest, no TRITON_INTERPRET
    (the CLI must switch the interpreter on before triton is first imported on a machine without a GPU)."""
    import os
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("with a GPU the Triton kernels compile for it; this checks the interpreter path")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-m", "parity.front.cli", "check", "--lowering", "hybrid_paged", "--max-examples", "4",
                          "--report", str(tmp_path), "--quiet", "--device", "cpu"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hybrid_paged  pass" in res.stdout


def test_kernel_names_every_reaches_the_run_options(monkeypatch, tmp_path):
    """`--kernel-names-every N` sets how often a CUDA case is profiled for its kernel names (0: never)."""
    import parity.front.cli as cli_mod
    seen = []

    def fake_check_lowering(lw, pol, **kw):
        seen.append(kw["opts"].profile_every)
        raise SystemExit(0)

    import parity.engine.sweep as sweep_mod
    monkeypatch.setattr(sweep_mod, "check_lowering", fake_check_lowering)
    for n, want in ((None, 4), ("0", 0), ("16", 16)):
        argv = ["check", "--no-isolate", "--lowering", "sdpa", "--max-examples", "1", "--report", str(tmp_path / "r"), "--quiet"]
        if n is not None:
            argv += ["--kernel-names-every", n]
        try:
            cli_mod.main(argv)
        except SystemExit:
            pass
        assert seen[-1] == want


def test_limit_widens_and_narrows_the_drawn_shapes(tmp_path):
    """`--limit` replaces fields of each lowering's own limits: only fp16, D=64 cases are drawn, in this
    process and in `--jobs` children alike."""
    import json

    for extra in ((), ("--jobs", "2")):
        rep = tmp_path / ("jobs" if extra else "serial")
        code = cli.main(["check", "--lowering", "decode_rows", "--lowering", "sdpa", "--device", "cpu", "--no-isolate",
                         "--quiet", "--max-examples", "8", "--limit", "dtypes=float16", "--limit", "head_dims=64",
                         "--limit", "kv_dtypes=same", "--report", str(rep), *extra])
        data = json.loads((rep / "parity.json").read_text())
        assert code == 0
        for name, v in data["lowerings"].items():
            n = 8 + len(check_cases(lowerings.get(name), "cpu", profile="ci", overrides=limit_overrides(
                ["dtypes=float16", "head_dims=64", "kv_dtypes=same"])).boundaries)
            assert v["cases"] == n and all(c.startswith("float16/float16/") for c in v["classes"]), (name, v["classes"])
            assert v["worst_case"]["head_dim"] == 64


def test_a_bad_limit_is_named(tmp_path, capsys):
    code = cli.main(["check", "--lowering", "sdpa", "--device", "cpu", "--limit", "head_dim=64", "--report", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--limit: expected FIELD=VALUE with FIELD one of max_batch" in err, err
