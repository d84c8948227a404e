"""A run split over machines: `check --shard I/S` on each, `dflash-parity merge` of their reports
(parity/report/merge.py), compared with the serial run; the refusals of shards that are not one run's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from parity.front import cli

ROOT = Path(__file__).resolve().parents[2]
MUTANT = ROOT / "examples" / "plugin_window_off_by_one.py"
COMMON = ["--plugin", str(MUTANT), "--lowering", "decode_rows", "--lowering", "my_windowed_merge", "--max-examples",
          "6", "--no-isolate", "--quiet", "--device", "cpu", "--flaky-runs", "0", "--limit", "max_batch=2", "--limit",
          "max_context=64", "--limit", "max_production_context=0", "--limit", "head_dims=64"]  # small cases: cheap
SAME = ("status", "cases", "passed", "unsupported", "judged", "calls_checked", "classes", "drawn", "worst_margin",
        "worst_case", "worst_figures", "worst_ulp", "worst_ulp_case", "worst_rel_l2", "worst_rel_l2_case")

pytestmark = pytest.mark.usefixtures("restore_registry", "single_threaded_torch")  # tests/conftest.py


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A serial check, the same check in three shards, and their merge (module-scoped: run once)."""
    import lowerings
    from lowerings import registry

    tmp = tmp_path_factory.mktemp("shards")
    codes = {}
    lowerings.names()
    saved = dict(registry._REGISTRY)
    for name, extra in [("serial", [])] + [(f"s{i}", ["--shard", f"{i}/3"]) for i in range(3)]:
        registry._REGISTRY.pop("my_windowed_merge", None)  # each check loads the plugin file again
        codes[name] = cli.main(["check", *COMMON, "--report", str(tmp / name), *extra])
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    codes["merge"] = cli.main(["merge", *(str(tmp / f"s{i}") for i in (2, 0, 1)), "--report", str(tmp / "merged"),
                               "--quiet"])
    return tmp, codes


def _report(d: Path) -> dict:
    return json.loads((d / "parity.json").read_text())


def test_three_shards_merge_into_the_serial_report(runs):
    tmp, codes = runs
    assert codes == {"serial": 1, "s0": 1, "s1": 1, "s2": 1, "merge": 1} or codes["merge"] == codes["serial"] == 1
    serial, merged = _report(tmp / "serial"), _report(tmp / "merged")
    assert merged["verdict"] == serial["verdict"] == "fail"
    assert "shard" not in merged["settings"] and merged["settings"]["max_examples"] == serial["settings"]["max_examples"]
    assert [m["shard"] for m in merged["merged_from"]] == ["0/3", "1/3", "2/3"]
    s, m = serial["lowerings"]["decode_rows"], merged["lowerings"]["decode_rows"]
    assert {k: m[k] for k in SAME} == {k: s[k] for k in SAME}
    assert m["shards"] == 3 and "compile_family_counts" not in m
    # each shard judged its share of the serial run's cases, and only its share
    parts = [_report(tmp / f"s{i}")["lowerings"]["decode_rows"]["cases"] for i in range(3)]
    assert sum(parts) == s["cases"] and min(parts) > 0  # shard 0 also ran the boundary cases
    # the failure: shrunk in the shard that found it, the serial run's shrunk case among the merged ones
    s, m = serial["lowerings"]["my_windowed_merge"], merged["lowerings"]["my_windowed_merge"]
    assert m["status"] == "fail" and all(f["shrunk"] for f in m["failures"])
    assert s["failures"][0]["case"] in [f["case"] for f in m["failures"]]
    for n, f in enumerate(m["failures"], 1):
        saved = json.loads((tmp / "merged" / f["file"]).read_text())
        assert f["file"] == f"failures/my_windowed_merge-{n}.json" and saved["case"] == f["case"]
        assert str(tmp / "merged" / f["file"]) in saved["replay"]
    assert (tmp / "s0" / "parity.json").is_file() and list((tmp / "s0").glob("failures/*.json")) is not None
    assert "# dflash-parity: FAIL" in (tmp / "merged" / "summary.md").read_text()


def test_the_gate_reads_the_merged_report_and_refuses_a_lone_shard(runs, capsys):
    tmp, _ = runs
    code = cli.main(["gate", str(tmp / "merged"), "--baseline", str(tmp / "serial")])
    out = capsys.readouterr().out
    assert code == 1 and "lowering-removed" not in out and "fewer-cases" not in out  # fails on the mutant only
    assert "my_windowed_merge" in out
    code = cli.main(["gate", str(tmp / "s1"), "--baseline", str(tmp / "serial")])
    out = capsys.readouterr().out
    assert code == 1 and "the new report is shard 1/3 of a run split over machines: merge the shards" in out


def _copy(tmp: Path, name: str, edit=None) -> str:
    d = tmp / f"edit-{name}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(tmp / name, d)
    if edit is not None:
        data = _report(d)
        edit(data)
        (d / "parity.json").write_text(json.dumps(data))
    return str(d)


@pytest.mark.parametrize("which, says", [
    ("missing", "shard(s) 2/3 missing"),
    ("twice", "shard 1/3 given twice"),
    ("settings", "settings.max_examples: 7 here, 6 in"),
    ("policy", "policy: "),
    ("serial", "not a shard of a run (it was not checked with --shard I/S)"),
    ("unfinished", "is marked in progress"),
    ("into-input", "is one of the shard reports"),
])
def test_shards_that_are_not_one_run_are_refused(runs, capsys, which, says):
    tmp, _ = runs
    s = [str(tmp / f"s{i}") for i in range(3)]
    out = str(tmp / "out")
    if which == "missing":
        argv = s[:2]
    elif which == "twice":
        argv = s + [_copy(tmp, "s1")]
    elif which == "settings":
        argv = s[:2] + [_copy(tmp, "s2", lambda d: d["settings"].update(max_examples=7))]
    elif which == "policy":
        argv = s[:2] + [_copy(tmp, "s2", lambda d: d["policy"].update(sha256="0" * 64))]
    elif which == "serial":
        argv = s + [str(tmp / "serial")]
    elif which == "unfinished":
        d = _copy(tmp, "s2")
        (Path(d) / "IN_PROGRESS").write_text("{}")
        argv = s[:2] + [d]
    else:
        argv, out = s, s[0]
    code = cli.main(["merge", *argv, "--report", out])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_failure_found_by_two_shards_is_copied_from_a_shard_that_found_it(tmp_path):
    """Shards 0 and 1 shrank to case A, shard 2 to case B: the merged report has A and B once each, and
    B's file is shard 2's (each shard numbers its own failures from 1)."""
    from parity.report.merge import copy_failures

    cases = {"A": {"seed": 1}, "B": {"seed": 2}}
    for shard, name in enumerate("AAB"):
        d = tmp_path / f"s{shard}" / "failures"
        d.mkdir(parents=True)
        (d / "m-1.json").write_text(json.dumps({"case": cases[name], "from": f"s{shard}"}))
    (tmp_path / "out" / "failures").mkdir(parents=True)
    entry = {"failures": [{"case": cases["A"], "file": "failures/m-1.json"},
                          {"case": cases["B"], "file": "failures/m-1.json"}]}
    copy_failures(tmp_path / "out", "m", entry, [(cases[n], tmp_path / f"s{i}") for i, n in enumerate("AAB")])
    assert [f["file"] for f in entry["failures"]] == ["failures/m-1.json", "failures/m-2.json"]
    copied = [json.loads((tmp_path / "out" / "failures" / f"m-{n}.json").read_text()) for n in (1, 2)]
    assert [(c["case"], c["from"]) for c in copied] == [(cases["A"], "s0"), (cases["B"], "s2")]
    assert str(tmp_path / "out" / "failures" / "m-2.json") in copied[1]["replay"]


# ---- a shard report is input (issue 49): paths, verdicts, partitions, sizes, machine facts ------------------

def _merge(argv: list, capsys) -> tuple[int, str]:
    code = cli.main(["merge", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, err


def _with_failure_file(tmp: Path, file: str) -> str:
    """A copy of shard 1 whose first failure of the mutant names `file`."""
    def edit(d):
        fails = d["lowerings"]["my_windowed_merge"]["failures"]
        assert fails, "shard 1 of the mutant found a failure"
        fails[0]["file"] = file
    return _copy(tmp, "s1", edit)


@pytest.mark.parametrize("how", ["../../x", "absolute", "link out"])
def test_a_failure_file_outside_its_shard_is_refused(runs, tmp_path, capsys, how):
    """A failure file named `../../x`, an absolute path or a link out of the shard's directory: refused
    naming the shard and the field (exit 2), before the output directory is written; nothing is copied."""
    tmp, _ = runs
    secret = tmp / "x"
    secret.write_text("a file outside every report directory\n")
    if how == "link out":
        d = _with_failure_file(tmp, "failures/linked.json")
        (Path(d) / "failures" / "linked.json").symlink_to(secret)
    else:
        d = _with_failure_file(tmp, "../../x" if how == "../../x" else str(secret))
    out = tmp_path / "out"
    code, err = _merge([tmp / "s0", d, tmp / "s2", "--report", out, "--quiet"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"REPORT {d}/parity.json: lowerings.my_windowed_merge.failures[0].file" in err and "outside" in err, err
    assert not out.exists() or not any("outside every report" in f.read_text() for f in out.rglob("*.json"))


def test_a_shard_edited_to_pass_merges_as_fail(runs, tmp_path, capsys):
    """Every shard hand-edited to `"status": "pass"` and `"verdict": "pass"` with its failures still listed:
    the merged verdict is recomputed from the cases and failures (fail, exit 1)."""
    tmp, _ = runs

    def edit(d):
        d["verdict"] = "pass"
        for v in d["lowerings"].values():
            v["status"] = "pass"
    shards = [_copy(tmp, f"s{i}", edit) for i in range(3)]
    assert any(_report(Path(s))["lowerings"]["my_windowed_merge"]["failures"] for s in shards)
    code, err = _merge([*shards, "--report", tmp_path / "out", "--quiet"], capsys)
    merged = _report(tmp_path / "out")
    assert code == 1 and merged["verdict"] == "fail", err
    assert merged["lowerings"]["my_windowed_merge"]["status"] == "fail"


def test_a_shard_relabelled_as_another_is_refused(runs, tmp_path, capsys):
    """Shard 0's report copied and relabelled as shard 1 (its run id unchanged): named as a copy, exit 2."""
    tmp, _ = runs
    relabelled = _copy(tmp, "s0", lambda d: d["settings"].update(shard="1/3"))
    code, err = _merge([tmp / "s0", relabelled, tmp / "s2", "--report", tmp_path / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"REPORT {relabelled}/parity.json: shard 1/3 is a copy of another shard's report" in err, err


@pytest.mark.parametrize("count", ["2000", "30000000"])
def test_a_huge_shard_count_is_refused_before_anything_is_sized(runs, tmp_path, capsys, count):
    """`check --shard 0/S` and a shard report claiming S past the documented range: refused (exit 2),
    never an allocation of S entries; so are more shard reports than a run can have."""
    tmp, _ = runs
    code = cli.main(["check", "--shard", f"0/{count}", *COMMON, "--report", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "--shard: S at most 1024 shards" in err, err
    huge = _copy(tmp, "s0", lambda d: d["settings"].update(shard=f"0/{count}"))
    code, err = _merge([huge, "--report", tmp_path / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "settings.shard: S at most 1024 shards" in err, err
    code, err = _merge([tmp / "s0"] * 1025 + ["--report", tmp_path / "out"], capsys)
    assert code == 2 and "1025 shard reports given; a run is split in at most 1024 shards" in err, err


def test_shards_differ_freely_in_machine_facts(runs, tmp_path, capsys):
    """The same policy file at another path, another core count (threads), another device name: one run."""
    tmp, _ = runs

    def elsewhere(d):
        d["policy"]["file"] = d["tolerances"] = "/elsewhere/tolerances.toml"
        d["settings"].update(threads=64, device_name="another host")
    moved = _copy(tmp, "s2", elsewhere)
    code, err = _merge([tmp / "s0", tmp / "s1", moved, "--report", tmp_path / "out", "--quiet"], capsys)
    assert code == 1 and _report(tmp_path / "out")["verdict"] == "fail", err  # the mutant's failure, as merged


def test_merge_into_an_empty_report_path_is_refused(runs, tmp_path, capsys, monkeypatch):
    """`--report ''` once merged into the working directory."""
    tmp, _ = runs
    monkeypatch.chdir(tmp_path)
    code, err = _merge([tmp / "s0", tmp / "s1", tmp / "s2", "--report", ""], capsys)
    assert code == 2 and "--report: an empty path" in err and not list(tmp_path.iterdir()), err
