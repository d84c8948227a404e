"""File names made from lowering names: one-to-one, never a path, never another lowering's (the outcome model
names a failure's file in its report entry; `parity.report.file_names` re-exports these names).

A lowering's name is any string a plugin chose. Its failure files are `failures/<stem>-<n>.json`
(`failure_filename`), its `--jobs` parts and shard directories `parts/<stem>...`.

- `lowering_stem(name)`: a name of ASCII letters, digits, `.`, `_` and `-` that starts with a letter, a
  digit or `_` and has at most `MAX_PLAIN` characters is its own stem (every built-in name; the names of reports
  written before this rule). Any other name becomes its characters of that set (each other one as `_`, a
  leading `.` or `-` as `_`, at most 40 of them), `~`, and the first 12 hex digits of the SHA-256 of its
  UTF-8 bytes: `a/b` is `a_b~<hash>`, distinct from the plain `a_b`, since no plain stem has a `~`; two
  escaped names share a stem only if their hashes agree in 48 bits.
- `stem_files(directory, stem)`: the failure files of exactly that stem, `<stem>-<digits>.json` (a glob
  `<stem>-*.json` also matched lowering `a-1`'s `a-1-1.json` for lowering `a`, and deleted them).
- `check_distinct(names, where)`: InvalidInput naming both lowerings when two names of one run still
  map to one stem (a hash collision), before any file of theirs is written.

Public: `lowering_stem`, `failure_filename`, `stem_files`, `check_distinct`, `MAX_PLAIN`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable

from oracle.errors import InvalidInput

MAX_PLAIN = 100  # characters of a name used as its own stem (with "-<n>.json", well within 255 bytes)
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def lowering_stem(lowering: str) -> str:
    """A lowering's name as a file name stem, one-to-one (see the module docstring)."""
    name = str(lowering)
    if len(name) <= MAX_PLAIN and _PLAIN.match(name):
        return name
    readable = _UNSAFE.sub("_", name)[:40]
    if readable[:1] in (".", "-"):
        readable = "_" + readable[1:]
    return f"{readable}~{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def failure_filename(lowering: str, n: int) -> str:
    """`<stem>-<n>.json`: the n-th failure file of a lowering (n from 1)."""
    return f"{lowering_stem(lowering)}-{n}.json"


def stem_files(directory: str | Path, stem: str) -> list[Path]:
    """The files `<stem>-<digits>.json` in `directory` (none when it is missing), sorted."""
    d = Path(directory)
    if not d.is_dir():
        return []
    pattern = re.compile(re.escape(stem) + r"-[0-9]+\.json\Z")
    return sorted(p for p in d.iterdir() if pattern.match(p.name))


def check_distinct(names: Iterable[str], where: str = "--lowering") -> None:
    """Refuse two lowerings whose names map to one stem (see the module docstring)."""
    seen: dict[str, str] = {}
    for name in names:
        stem = lowering_stem(name)
        if stem in seen and seen[stem] != name:
            raise InvalidInput(where, f"the lowerings {seen[stem]!r} and {name!r} map to one file name stem "
                                      f"{stem!r}: their failure files would overwrite each other; rename one")
        seen[stem] = name
