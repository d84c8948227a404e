"""`check --jobs N --shards NAME=S`: one lowering's cases split over S child processes.

A lowering whose cases are dominated by per-process work that does not parallelize inside a process
(`torch.compile` traces a new graph for each shape family it sees: about a second of dynamo per family)
gets S child `check` processes instead of one. Shard `i` draws the very cases a serial run draws and
runs those whose draw index is `i` modulo S (`parity.sweep.sharded_run_case`), so the S shards of a
derandomized profile run each of the serial run's cases exactly once; a random profile's shards each draw
their own. A shard that finds a failure shrinks it itself, judging every case hypothesis tries.

Each shard writes its entry to `<report>/parts/<lowering>.shard-<i>-of-<S>.json` and works in its own
directory next to it (its failure files, its case in flight), so shards never write the same file. Only
shard 0 replays the lowering's saved failures. `merge_entries` makes one report entry of the shards':
counts and phase times add up (with each shard's untimed `draw`), the worst figures are the worst of any shard, the wall time is the slowest
shard's, failures and notes are kept (notes prefixed with their shard). Compile counts stay per process,
as a deployment counts them: a family compiled in two shards is compiled at most `max_compiles` times
in each, and the merged entry counts the distinct families over all shards. `collect_failures` moves the
shards' failure files into `<report>/failures/`, numbered as a serial run numbers them, and keeps the
first case a dead shard left in flight for the next run's replay.

Public: `parse_shards(values, names) -> {name: S}`, `shard_label`, `shard_dir`, `merge_entries`,
`collect_failures`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from oracle.errors import InvalidInput

MAX_SHARDS = 64
FAMILY_KEYS = "compile_family_counts"  # a part's {repr(family): compilations}; merged away


def parse_shards(values: Sequence[str], names: Sequence[str]) -> dict[str, int]:
    """`--shards NAME=S` values (repeatable) -> {lowering: S}; NAME must be one of the lowerings checked."""
    out: dict[str, int] = {}
    for text in values:
        name, sep, count = text.rpartition("=")
        if not sep or not name:
            raise InvalidInput("--shards", f"expected NAME=S (a lowering and a shard count), got {text!r}")
        if name not in names:
            raise InvalidInput("--shards", f"{name!r} is not among the lowerings checked ({', '.join(names)})")
        try:
            n = int(count)
        except ValueError:
            n = 0
        if not 2 <= n <= MAX_SHARDS:
            raise InvalidInput("--shards", f"the shard count of {name} must be an integer from 2 to {MAX_SHARDS}, "
                                           f"got {count!r}")
        if name in out:
            raise InvalidInput("--shards", f"{name} is given twice")
        out[name] = n
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """A child's `--shard I/S` (0 <= I < S) -> (I, S)."""
    i, _, n = text.partition("/")
    try:
        shard = int(i), int(n)
    except ValueError:
        shard = (-1, 0)
    if not 0 <= shard[0] < shard[1]:
        raise InvalidInput("--shard", f"expected I/S with 0 <= I < S, got {text!r}")
    return shard


def shard_label(name: str, shard: tuple[int, int] | None) -> str:
    """How progress lines and notes name one shard of a lowering."""
    return name if shard is None else f"{name} [shard {shard[0] + 1}/{shard[1]}]"


def shard_dir(report_dir: Path, stem: str, shard: tuple[int, int]) -> Path:
    """The directory one shard writes its failure files and its case in flight to."""
    return Path(report_dir) / "parts" / f"{stem}.shard-{shard[0]}-of-{shard[1]}"


def _worst(entries: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return max(entries, key=lambda v: float(v.get(key) or 0.0) if not isinstance(v.get(key), str) else float("inf"))


def _counted(ran: Sequence[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """The shards' `{name: {"cases": n, "why": str}}` tables under `key` (`bounds`, `skipped`) summed: the
    cases add up, the first shard's reason stays."""
    out: dict[str, dict[str, Any]] = {}
    for v in ran:
        for name, u in (v.get(key) or {}).items():
            entry = out.setdefault(name, {"cases": 0, "why": u.get("why", "")})
            entry["cases"] += int(u.get("cases", 0))
    return out


def merge_entries(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report entry from the entries of a lowering's shards (in shard order)."""
    entries = list(entries)
    ran = [v for v in entries if v["status"] != "unavailable"]
    if not ran:
        return dict(entries[0])
    statuses = {v["status"] for v in ran}
    out = dict(max(ran, key=lambda v: int(v.get("cases", 0))))  # a shard that ran (not a lost one's stub)
    out["status"] = "fail" if "fail" in statuses else "pass"
    for key in ("cases", "passed", "unsupported", "judged", "calls_checked"):
        out[key] = sum(int(v.get(key, 0)) for v in ran)
    out["seconds"] = max(float(v.get("seconds", 0.0)) for v in ran)
    w = _worst(ran, "worst_margin")
    out.update(worst_margin=w["worst_margin"], worst_case=w["worst_case"], worst_figures=w["worst_figures"])
    for key in ("worst_ulp", "worst_rel_l2"):
        w = _worst(ran, key)
        out[key], out[key + "_case"] = w[key], w[key + "_case"]
    compiles: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    phases: dict[str, float] = {}
    families: dict[str, int] = {}
    for v in ran:
        for k, n in v.get("compiles", {}).items():
            compiles[k] = compiles.get(k, 0) + n
        for k, c in v.get("classes", {}).items():
            cls = classes.setdefault(k, {"cases": 0, "failed": 0})
            cls["cases"] += c["cases"]
            cls["failed"] += c["failed"]
        timed = 0.0
        for k, x in v.get("phase_seconds", {}).items():
            phases[k] = round(phases.get(k, 0.0) + float(x), 3)
            timed += float(x)
        if timed and float(v.get("seconds", 0.0)) > timed:  # each shard's untimed part, as phase_line counts it
            phases["draw"] = round(phases.get("draw", 0.0) + float(v["seconds"]) - timed, 3)
        for fam, n in v.get(FAMILY_KEYS, {}).items():
            families[fam] = max(families.get(fam, 0), n)
    out.update(compiles=compiles, classes=classes, phase_seconds=phases, bounds=_counted(ran, "bounds"))
    if any("drawn" in v for v in ran):
        from parity import drawn
        out["drawn"] = drawn.merge([v.get("drawn") for v in ran])
    skipped = _counted(ran, "skipped")
    if skipped:
        out["skipped"] = skipped
    out["compile_families"] = len(families) if families else max(v.get("compile_families", 0) for v in ran)
    out["max_compiles_in_a_family"] = max(v.get("max_compiles_in_a_family", 0) for v in ran)
    out.pop(FAMILY_KEYS, None)
    out["notes"] = [f"shard {n + 1}/{len(entries)}: {note}" for n, v in enumerate(entries) for note in v.get("notes", [])]
    out["failures"] = [f for v in entries for f in v.get("failures", [])]
    out["shards"] = len(entries)
    return out


def collect_failures(report_dir: Path, stem: str, entry: dict[str, Any], shard_dirs: Sequence[Path]) -> None:
    """Move the shards' failure files into `<report>/failures/` as `<stem>-1.json`, `-2`, ... (replacing
    this lowering's old ones), pointing `entry["failures"][*]["file"]` at them; keep the first case a
    shard left in flight in `<report>/inflight/` for the next run's replay."""
    fdir = Path(report_dir) / "failures"
    for old in fdir.glob(f"{stem}-*.json"):
        old.unlink()
    moved: dict[str, str] = {}
    n = 0
    for d in shard_dirs:
        for f in sorted((d / "failures").glob(f"{stem}-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
            n += 1
            new = f"failures/{stem}-{n}.json"
            fdir.mkdir(parents=True, exist_ok=True)
            os.replace(f, Path(report_dir) / new)
            moved[f"{d.name}/failures/{f.name}"] = new
    for fl in entry.get("failures", []):
        fl["file"] = moved.get(fl.get("file", ""), fl.get("file", ""))
    inflight = Path(report_dir) / "inflight"
    for d in shard_dirs:
        for f in (d / "inflight").glob("*.json") if (d / "inflight").is_dir() else ():
            if not (inflight / f.name).exists():
                inflight.mkdir(parents=True, exist_ok=True)
                shutil.move(str(f), inflight / f.name)


def shard_part_entry(entry: dict[str, Any], work_dir: Path, family_counts: dict[tuple, int]) -> dict[str, Any]:
    """A shard's part entry: its failure files named by shard directory (so `collect_failures` finds
    them) and its per-family compile counts (so `merge_entries` counts distinct families)."""
    out = json.loads(json.dumps(entry))
    for fl in out.get("failures", []):
        fl["file"] = f"{work_dir.name}/{fl['file']}"
    out[FAMILY_KEYS] = {repr(k): n for k, n in family_counts.items()}
    return out
