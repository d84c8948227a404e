"""Sum the cProfiles a check wrote under `DFLASH_PARITY_CPROFILE=DIR` (`parity.exec.host_profile`), per role.

    python lab/host_profile_summary.py DIR [--top N] [--match TEXT]

For each role (`check`: a check process, with `--jobs` the parent; `part`: a `--jobs` child, one lowering or
shard; `worker`: an isolated case worker) the profiles of all its
processes are added up (`pstats.Stats.add`) and the N functions with the most own time are printed, then the N
with the most cumulative time, with the process count and the total seconds profiled. `--match TEXT`: only the
processes whose profile holds a function whose file or name contains TEXT (e.g. a lowering's module).
"""

from __future__ import annotations

import argparse
import io
import pstats
import re
import sys
from collections import defaultdict
from pathlib import Path


def _holds(stats: pstats.Stats, text: str) -> bool:
    return any(text in f"{file}:{name}" for (file, _line, name) in stats.stats)  # type: ignore[attr-defined]


_PREFIX = re.compile(r"/\S*?/(?:site-packages|dist-packages|lib/python3\.\d+)/")


def _short(line: str) -> str:
    """A pstats line with the folders before a package's own path dropped."""
    return _PREFIX.sub("", line)


def summarize(folder: Path, top: int, match: str | None) -> str:
    groups: dict[str, list[Path]] = defaultdict(list)
    for f in sorted(folder.glob("*.prof")):
        groups[f.name.rsplit("-", 1)[0]].append(f)
    out = io.StringIO()
    for role, files in sorted(groups.items()):
        kept = []
        for f in files:
            try:
                s = pstats.Stats(str(f))
            except Exception as exc:  # noqa: BLE001  (a truncated profile: said, skipped)
                print(f"{f.name}: unreadable ({type(exc).__name__})", file=out)
                continue
            if match is None or _holds(s, match):
                kept.append(s)
        if not kept:
            continue
        total = kept[0]
        for s in kept[1:]:
            total.add(s)
        print(f"== {role}: {len(kept)} processes, {total.total_tt:.1f} s profiled", file=out)  # type: ignore[attr-defined]
        for key, title in (("tottime", "own time"), ("cumulative", "cumulative")):
            buf = io.StringIO()
            total.stream = buf  # type: ignore[attr-defined]
            total.sort_stats(key).print_stats(top)
            lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
            start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
            print(f"-- by {title}", file=out)
            for ln in lines[start:start + top + 1]:
                print(_short(ln)[:200], file=out)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default=None)
    a = ap.parse_args(argv)
    if not a.folder.is_dir():
        print(f"folder: not a directory: {a.folder}", file=sys.stderr)
        return 2
    print(summarize(a.folder, a.top, a.match), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
