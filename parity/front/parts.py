"""The parts of one report: what each `check --jobs` child (or pytest-xdist worker) wrote, and their merge.

Each child writes its lowering's entry to `<report>/parts/<lowering>.json` (a shard's to
`<lowering>.shard-<i>-of-<S>.json`: `part_path`) and its failure files to `<report>/failures/` (a shard to its own
directory, `parity.front.shards.shard_dir`), its terminal table to the `.log` beside its part, the CPU seconds of its
isolated workers to `.workers-cpu` (`workers_cpu_path`). When all are done, `merge_parts` puts the entries back in
the order asked for. A child that died without writing its part (killed, out of memory, a crash outside any case)
becomes a failed entry that says how it exited and where its log is: nothing is silently missing from the report.
A sharded lowering's parts merge into its one entry (`merge_lowering`, also the pytest plugin's merge of its
pytest-xdist workers' parts).

Public: `part_path`, `shared_draws_path`, `workers_cpu_path`, `merge_lowering`, `merge_parts`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from parity.engine.outcome import FAMILY_KEYS, LoweringReport
from parity.front import shards as shards_mod
from parity.report.file_names import lowering_stem
from parity.report.files import to_json

Shard = tuple[int, int]  # (i, S): the i-th of S shards, 0-based


def part_path(report_dir: Path, name: str, shard: Shard | None = None) -> Path:
    """Where the child checking `name` (or one shard of it) writes its report entry."""
    suffix = "" if shard is None else f".shard-{shard[0]}-of-{shard[1]}"
    return Path(report_dir) / "parts" / f"{lowering_stem(name)}{suffix}.json"


def shared_draws_path(report_dir: Path, name: str, shards: int) -> Path:
    """The file through which the `shards` shard processes of lowering `name` share one drawer
    (`parity.exec.draw_ahead.SharedDraws`); removed before the shards start, so that one is never an earlier run's."""
    return Path(report_dir) / "parts" / f"{lowering_stem(name)}.draws-of-{shards}"


def workers_cpu_path(report_dir: Path, name: str, shard: Shard | None = None) -> Path:
    """Where that child writes the CPU seconds of its isolated workers (one number), which run outside its
    process tree (a fork server's children), so its own CPU seconds do not hold them."""
    return part_path(report_dir, name, shard).with_suffix(".workers-cpu")


def _lost_entry(name: str, device: str, why: str) -> dict[str, Any]:
    """The report entry of a lowering whose child wrote no part: a failure that says why."""
    return to_json([LoweringReport(name, device, "fail", extra=[why])], device=device, profile="",
                   tolerances="")["lowerings"][name]


def _tail(path: Path, n: int = 6) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _read_part(report_dir: Path, name: str, shard: Shard | None, exits: dict[str, int | None],
               device: str) -> dict[str, Any]:
    """One child's entry, or a failed entry saying why there is none."""
    path, label = part_path(report_dir, name, shard), shards_mod.shard_label(name, shard)
    if path.is_file():
        try:
            return json.loads(path.read_text())["lowerings"][name]
        except (OSError, ValueError, KeyError) as err:
            return _lost_entry(name, device, f"the check process wrote an unreadable part {path}: "
                                             f"{type(err).__name__}: {err}")
    log = path.with_suffix(".log")
    if label not in exits:
        why = "the check process for this lowering was never started (the run was interrupted first)"
    else:
        code = exits[label]
        how = f"exited with code {code}" if code is not None and code >= 0 else f"was killed by signal {-(code or 0)}"
        why = (f"the check process for this lowering {how} without writing its report "
               f"(log {log}: {_tail(log)[:400]})")
    return _lost_entry(name, device, why)


def merge_lowering(report_dir: Path | None, name: str, entries: Sequence[dict[str, Any]], dirs: Sequence[Path],
                   *, sharded: bool, keep_families: bool = False) -> dict[str, Any]:
    """One lowering's entry from its parts' (in shard order; `sharded`: they are shards to merge, else the
    one entry): the parts' failure files moved from `dirs` into `<report>/failures/` (numbered as a serial
    run numbers them); the per-family compile counts kept only with `keep_families` (a report that is
    itself one shard of a run over several machines)."""
    entry = shards_mod.merge_entries(entries, name) if sharded else dict(entries[0])
    if report_dir is not None and dirs:
        shards_mod.collect_failures(report_dir, lowering_stem(name), entry, dirs)
    if keep_families:
        entry.setdefault(FAMILY_KEYS, {})
    else:
        entry.pop(FAMILY_KEYS, None)
    return entry


def merge_parts(report_dir: Path, names: Sequence[str], exits: dict[str, int | None], header: dict[str, Any],
                shards: dict[str, int] | None = None, keep_families: bool = False) -> dict[str, Any]:
    """One report from the children's parts, in the order of `names` (a missing part: a failed entry).
    `exits` is keyed by `shard_label`; a sharded lowering's parts merge into one entry (`merge_lowering`)."""
    data = dict(header)
    data["lowerings"] = {}
    device = header.get("device", "?")
    for name in names:
        n = (shards or {}).get(name, 1)
        if n == 1:
            entry = _read_part(report_dir, name, None, exits, device)
            data["lowerings"][name] = merge_lowering(report_dir, name, [entry], [], sharded=False,
                                                     keep_families=keep_families)
            continue
        entries = [_read_part(report_dir, name, (i, n), exits, device) for i in range(n)]
        stem = lowering_stem(name)
        data["lowerings"][name] = merge_lowering(report_dir, name, entries,
                                                 [shards_mod.shard_dir(report_dir, stem, (i, n)) for i in range(n)],
                                                 sharded=True, keep_families=keep_families)
    return data
