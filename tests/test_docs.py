"""The docs stay navigable: every relative link of README.md, CHANGELOG.md, docs/ and lab/ resolves, docs/cli.md
names every verb and option the CLI parses, docs/plugins.md every optional hook a lowering may define, and no file
sends the reader to a folder outside the repository for the semantics or the bug catalogue.

The reference pages (README.md and docs/*.md; the lab notebook, docs/lab/ and docs/gpu/, is dated and kept as it
was written) name only files and modules that exist, cite a GPU record by link and never as "run 37 showed" prose,
and name every script of scripts/ (what stays in the product is documented); docs/performance.md fits on two
screens and docs/gpu-runner.md reads as numbered steps, each with its command.

Each check is also shown to catch a planted violation (the helpers take the text to check).
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

from lowerings.protocol import OPTIONAL_ATTRIBUTES, OPTIONAL_METHODS
from parity.front.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
OUTSIDE = re.compile(r"shared folder|SEMANTICS\.md|BUGS\.md")
PENDING = {"pytest.md"}  # written with the pytest plugin's rework (issue 15); linked ahead of it
REFERENCE = ("concepts", "cli", "plugins", "tolerances", "report-schema", "pytest", "semantics", "bugs", "gpu-runner",
             "performance")
PENDING_FILES: set[str] = set()  # files a reference page may name before they are written (none now)
PATH = re.compile(r"(?<![\w.-])((?:oracle|lowerings|strategies|parity|scripts|lab|tests|examples)/[\w./-]*[\w/])")
CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"\b(?:oracle|lowerings|strategies|parity)(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = {"json", "md", "toml", "py", "xml", "gz", "xz"}
RUN_PROSE = re.compile(r"\b(?:runs?|sessions?) ?\d+\b(?!-)", re.IGNORECASE)
MARKDOWN_LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")
TWO_SCREENS = 120


def broken_links(md: Path, text: str) -> list[str]:
    """Relative Markdown links of `text` (the file `md`) whose target does not exist."""
    return [t for t in LINK.findall(text) if "://" not in t and not (md.parent / t).exists()
            and Path(t).name not in PENDING]


def cli_options() -> dict[str, list[str]]:
    """Every verb of `dflash-parity` and its documented (not suppressed) long options."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {verb: [o for a in sp._actions if a.help != argparse.SUPPRESS for o in a.option_strings
                   if o.startswith("--") and o != "--help"]
            for verb, sp in sub.choices.items()}


def undocumented(text: str, options: dict[str, list[str]]) -> list[str]:
    missing = [f"verb {verb}" for verb in options if f"## {verb}" not in text]
    return missing + sorted({o for opts in options.values() for o in opts if f"`{o}" not in text})


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md")), *sorted((ROOT / "lab").rglob("*.md"))]


def _reference_pages() -> list[Path]:
    return [ROOT / "README.md", *(DOCS / f"{name}.md" for name in REFERENCE)]


def _without_links(text: str) -> str:
    return MARKDOWN_LINK.sub("", text)


def missing_paths(md: Path, text: str) -> list[str]:
    """Repository paths named in `text` (outside link targets, which the link check reads) that exist neither from
    the repository's root nor from `md`'s folder."""
    found = PATH.findall(MARKDOWN_LINK.sub(lambda m: m.group(1), text))
    return sorted({p for p in found if p.rstrip("/") not in PENDING_FILES and not (ROOT / p).exists()
                   and not (md.parent / p).exists()})


def _names_in(path: Path) -> str:
    return (path / "__init__.py").read_text() if path.is_dir() else path.read_text()


def missing_modules(text: str, root: Path = ROOT) -> list[str]:
    """Dotted names in code spans (`parity.exec.warmup`, `oracle.reference.attention`) whose module is gone: from the
    top package, each part must be a module or package there, or a name its `__init__.py` (its file, for a module)
    mentions; past a module file's first name the rest is that name's attributes."""
    bad = set()
    for span in CODE.findall(text):
        for name in DOTTED.findall(span):
            parts = name.split(".")
            placeholder = any(x.isupper() for x in parts)  # `lowerings.NAME.worst_margin`: a field of parity.json
            if parts[-1] in FILE_SUFFIXES or placeholder or "/".join(parts[:3]) + ".py" in PENDING_FILES:
                continue
            path = root / parts[0]
            for part in parts[1:]:
                if path.is_dir() and ((path / part).is_dir() or (path / f"{part}.py").exists()):
                    path = path / part if (path / part).is_dir() else path / f"{part}.py"
                    continue
                if not re.search(rf"\b{re.escape(part)}\b", _names_in(path)):
                    bad.add(name)
                break
    return sorted(bad)


def run_prose(text: str) -> list[str]:
    """"run 37", "session 11" outside a Markdown link (a record is cited by a link, whose text may name it)."""
    return RUN_PROSE.findall(_without_links(text))


def test_every_relative_link_resolves():
    bad = {str(p.relative_to(ROOT)): broken_links(p, p.read_text()) for p in _markdown_files()}
    assert not {k: v for k, v in bad.items() if v}, bad
    assert broken_links(DOCS / "concepts.md", "see [the guide](no-such-page.md)") == ["no-such-page.md"]


def test_readme_links_every_doc():
    readme = (ROOT / "README.md").read_text()
    for name in ("concepts", "cli", "plugins", "tolerances", "report-schema", "semantics", "bugs", "pytest"):
        assert f"(docs/{name}.md)" in readme, name


def test_cli_doc_names_every_verb_and_option():
    text = (DOCS / "cli.md").read_text()
    options = cli_options()
    assert {"list", "check", "repro", "gate", "bench"} <= set(options) and "--profile" in options["check"]
    assert undocumented(text, options) == []
    assert undocumented(text.replace("`--case-timeout", "`--x"), options) == ["--case-timeout"]


def test_plugin_guide_names_every_optional_hook():
    text = (DOCS / "plugins.md").read_text()
    hooks = [*OPTIONAL_METHODS, *OPTIONAL_ATTRIBUTES]
    assert [h for h in hooks if f"`{h}" not in text] == []


def test_nothing_points_outside_the_repository_for_semantics_or_bugs():
    tracked = subprocess.run(["git", "ls-files", "--", "*.py", "*.md", "*.toml", "*.sh"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout (an sdist): read the tree instead
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.suffix in (".py", ".md", ".toml")
                   and ".venv" not in p.parts]
    this = str(Path(__file__).relative_to(ROOT))
    hits = [f for f in tracked if f != this and (ROOT / f).is_file() and not f.startswith("docs/gpu/")
            and OUTSIDE.search((ROOT / f).read_text(errors="replace"))]
    assert hits == [], f"point these at docs/semantics.md and docs/bugs.md: {hits}"
    assert OUTSIDE.search("see SEMANTICS.md (in the project's shared folder)")


def test_reference_pages_name_only_files_and_modules_that_exist():
    bad = {str(p.relative_to(ROOT)): missing_paths(p, p.read_text()) + missing_modules(p.read_text())
           for p in _reference_pages()}
    assert not {k: v for k, v in bad.items() if v}, bad
    assert missing_paths(DOCS / "cli.md", "run `scripts/gone.py` or lab/ x") == ["scripts/gone.py"]
    assert missing_paths(DOCS / "cli.md", "[lab/draw-bench.md](lab/draw-bench.md), `parity/engine/ports.py`") == []
    assert missing_modules("`parity.exec.no_such_module`, `parity.json`, `oracle.reference.attention(x)`, "
                           "`lowerings.NAME.worst_margin`") == [
        "parity.exec.no_such_module"]


def test_reference_pages_cite_records_by_link():
    bad = {str(p.relative_to(ROOT)): run_prose(p.read_text()) for p in _reference_pages()}
    assert not {k: v for k, v in bad.items() if v}, bad
    assert run_prose("as run 37 showed ([record](gpu/2026-12-02-h200-session11.md))") == ["run 37"]
    assert run_prose("([session 11](gpu/2026-12-02-h200-session11.md)); a reason dated run 2026-12-01") == []


def test_every_script_of_the_product_is_documented():
    text = "\n".join(p.read_text() for p in _reference_pages())
    scripts = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file())
    assert [s for s in scripts if f"scripts/{s}" not in text] == []


def test_performance_fits_two_screens_and_the_gpu_runner_reads_as_steps():
    assert len((DOCS / "performance.md").read_text().splitlines()) <= TWO_SCREENS
    assert (DOCS / "lab" / "performance-log.md").exists()  # the log by session, in the lab notebook
    text = (DOCS / "gpu-runner.md").read_text()
    steps = re.split(r"^## (\d)\. ", text, flags=re.MULTILINE)[1:]
    assert [int(n) for n in steps[::2]] == [1, 2, 3, 4, 5], "docs/gpu-runner.md: steps 1-5"
    assert all("```" in body.split("\n## ")[0] for body in steps[1::2]), "each step with its command"
