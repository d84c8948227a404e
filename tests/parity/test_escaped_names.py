"""Every name escaped (issue 49, item 5): lowering names that used to share a failure file; plugin text
(names, `available()` reasons, failure messages) that tried to forge a verdict in `summary.md`, `gate.md`
or `junit.xml`."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from lowerings import registry
from parity.report.escape import md_code, md_text, xml_text
from parity.report.file_names import check_distinct, lowering_stem
from tests.cli_runs import run

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py

TINY = ["--no-isolate", "--max-examples", "2", "--device", "cpu", "--quiet", "--flaky-runs", "0", "--limit",
        "max_batch=2", "--limit", "max_context=20", "--limit", "head_dims=64", "--limit", "max_production_context=0"]


# ---- names that collide ---------------------------------------------------------------------------------

PLUGIN = '''import torch
from lowerings import LoweringResult, register
from lowerings.torch_emulation import Sdpa


class Good(Sdpa):
    def __init__(self, name):
        self.name = name


class Zeros(Good):
    def run(self, inputs):
        res = super().run(inputs)
        return LoweringResult(out=torch.zeros_like(res.out), lse=res.lse)


for lw in (Zeros("a/b"), Good("a_b"), Zeros("x-1"), Good("x")):
    register(lw)
'''


def test_lowerings_whose_names_collided_keep_their_own_failure_files(tmp_path):
    """`a/b` (fails) and `a_b` (passes) once mapped to one failure-file name, and `x` deleted `x-1`'s
    files (`x-*.json`): writing the passing one's report deleted the failing one's case file."""
    plugin = tmp_path / "names.py"
    plugin.write_text(PLUGIN)
    d = tmp_path / "r"
    argv = ["check", "--plugin", plugin, *TINY, "--report", d]
    for name in ("a/b", "a_b", "x-1", "x"):
        argv += ["--lowering", name]
    with registry.restored():  # repro below loads the plugin again, from the failure file's record
        code, out, err = run(argv)
    assert code == 1, out + err
    lows = json.loads((d / "parity.json").read_text())["lowerings"]
    assert [n for n, v in lows.items() if v["status"] == "fail"] == ["a/b", "x-1"]
    for name in ("a/b", "x-1"):
        files = [f["file"] for f in lows[name]["failures"]]
        assert files and all((d / f).is_file() and json.loads((d / f).read_text())["lowering"] == name for f in files)
    code, out, err = run(["repro", d / lows["a/b"]["failures"][0]["file"], "--no-isolate", "--device", "cpu"])
    assert code == 1 and "a/b on " in out, out + err  # its replay finds it, and fails as it did


def test_stems_are_one_to_one_and_a_remaining_collision_is_named():
    names = ["a/b", "a_b", "a:b", "a b", "x", "x-1", "..", ".hidden", "-x", "é", "a" * 300, "context[fa2]"]
    stems = [lowering_stem(n) for n in names]
    assert len(set(stems)) == len(names) and all("/" not in s and len(s) < 120 for s in stems)
    assert lowering_stem("decode_rows") == "decode_rows" and lowering_stem("a_b") == "a_b"  # plain names as before
    check_distinct(names)
    with pytest.raises(ValueError, match="'p' and 'q' map to one file name stem"):
        import parity.engine.file_names as fn
        saved = fn.lowering_stem
        fn.lowering_stem = lambda n: "same"
        try:
            check_distinct(["p", "q"])
        finally:
            fn.lowering_stem = saved


# ---- text that tries to forge a verdict ------------------------------------------------------------------

FORGE = "\n## dflash-parity gate: PASS\n\n| `sdpa` | pass | pass | 1 -> 1 | 0.00 -> 0.00 | ok |\n# dflash-parity: PASS\n\x1b[2J"
FORGING = f'''from lowerings import register
from lowerings.torch_emulation import Sdpa

FORGE = {FORGE!r}


class Named(Sdpa):
    name = "x`" + FORGE


class Off(Sdpa):
    name = "off" + FORGE

    def available(self, device):
        return False, "no GPU" + FORGE


class Raises(Sdpa):
    name = "raises|" + FORGE

    def run(self, inputs):
        raise RuntimeError("boom" + FORGE)


for cls in (Named, Off, Raises):
    register(cls())
'''
NAMES = ["x`" + FORGE, "off" + FORGE, "raises|" + FORGE]


@pytest.fixture(scope="module")
def forged(tmp_path_factory) -> Path:
    """A report of three lowerings whose names, `available()` reason and failure message carry Markdown,
    and `gate` of it against itself (it fails: one lowering raises)."""
    tmp = tmp_path_factory.mktemp("forged")
    (tmp / "forging.py").write_text(FORGING)
    argv = ["check", "--plugin", tmp / "forging.py", *TINY, "--report", tmp / "r"]
    for name in NAMES:
        argv += ["--lowering", name]
    code, out, err = run(argv)
    assert code == 1, out + err
    code, out, err = run(["gate", tmp / "r", "--baseline", tmp / "r"])
    assert code == 1, out + err
    return tmp / "r"


def _structure(md: str) -> tuple[list[str], list[str]]:
    """The headings and the table rows of a Markdown file (lines starting `#` or `|`)."""
    lines = md.splitlines()
    return [ln for ln in lines if ln.startswith("#")], [ln for ln in lines if ln.startswith("|")]


def _cells(row: str) -> int:
    """The cells of a table row: its `|` not escaped by a backslash, less one."""
    return len(re.findall(r"(?<!\\)\|", row)) - 1


def test_plugin_text_forges_no_heading_or_row_in_summary_md(forged):
    heads, rows = _structure((forged / "summary.md").read_text())
    assert heads[0] == "# dflash-parity: FAIL" and heads[1] == "## Drawn cases" and len(heads) == 3, heads
    assert heads[2].startswith("## ``raises|") and heads[2].endswith("`` failed")
    assert len(rows) == 2 + 3 + 2 + 2 + 2 + 2, rows  # the table (3 lowerings), the drawn-cases and extremes tables
    # (2 that ran each)
    assert [_cells(r) for r in rows] == [10] * 5 + [12] * 4 + [7] * 4, rows  # no row gained or lost a cell


def test_plugin_text_forges_no_heading_or_row_in_gate_md(forged):
    heads, rows = _structure((forged / "gate.md").read_text())
    assert heads == ["## dflash-parity gate: FAIL"], heads
    assert len(rows) == 2 + 3 and [_cells(r) for r in rows] == [6] * 5, rows


def test_junit_xml_parses_with_the_names_as_given(forged):
    suite = ElementTree.parse(forged / "junit.xml").getroot()
    assert [c.get("name") for c in suite] == [xml_text(n) for n in NAMES]
    assert suite.get("failures") == "1" and suite.get("skipped") == "1"


def test_the_escapes_leave_plain_text_as_it_is_and_catch_each_construct():
    for plain in ("decode_rows", "output: max abs error 5.7 ulp > bound 0.5 ulp", "B=2 L=[34, 23] K=4", "x.py:3"):
        assert md_text(plain) == plain and md_code(plain) == f"`{plain}`"
    assert md_text("# h") == "\\# h" and md_text("1. a") == "1\\. a" and md_text("> q") == "\\> q"
    assert md_text("a\nb") == "a\\nb" and md_text("<h2>") == "\\<h2>" and md_text("[a](u)") == "[a]\\(u)"
    assert md_text("_x_ *y*") == "\\_x\\_ \\*y\\*" and md_text("a|b", table=True) == "a\\|b"
    assert md_code("a`b") == "``a`b``" and md_code("`a") == "`` `a ``" and md_code("a|b", table=True) == "`a\\|b`"
    assert xml_text("a\x1b\x00b\tc") == "a\\x1b\\x00b\tc"


def test_bench_md_cells_and_notes_are_escaped():
    """bench.md's tables hold plugin labels and reasons: a carriage return (a line break to Markdown) or a
    `|` in one adds no heading, row or cell."""
    from parity.bench.render import md_table

    forged = "x\r# dflash-parity bench: pass\r| a | b |" + FORGE
    heads, rows = _structure(md_table([["what", "result"], [forged, "fail: " + forged]]))
    assert heads == [] and len(rows) == 3 and [_cells(r) for r in rows] == [2, 2, 2], rows
