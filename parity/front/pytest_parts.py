"""The pytest plugin's parts of a report: what one pytest process checked, and their merge on the controller.

Each `parity_check` call is recorded as a part of its lowering, keyed by the shard item it ran (`record`);
at the end of the session every process turns its parts into JSON records with their failure files
written under `<report>/parts/` (`part_records`), pytest-xdist workers send theirs to the controller, and
the controller merges each lowering's parts into one report (`merged_report`, the merge `check --jobs`
uses: `parity.front.parts.merge_lowering`). Also the parametrization of `parity_lowering` into shard items
(`lowering_params`), a failed test's message (`failure_text`) and the log filter that keeps library debug
lines out of it (`quiet_library_logs`).

Public: `LoweringParam`, `lowering_params`, `quiet_library_logs`, `failure_text`, `work_dir`, `record`,
`part_records`, `merged_report`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest

Item = tuple[int, int] | None


class LoweringParam(str):
    """A `parity_lowering` parameter: the lowering's name, and the shard item it is (`shard = (j, n)`)."""

    shard: Item = None

    def __new__(cls, name: str, shard: Item = None) -> "LoweringParam":
        obj = super().__new__(cls, name)
        obj.shard = shard
        return obj


def lowering_params(names: list[str], items_per_lowering: int) -> list[Any]:
    """The `parity_lowering` parameters: each lowering whole (one worker), or in `items_per_lowering`
    shard items `NAME-shardJofN` (pytest-xdist workers share its cases)."""
    if items_per_lowering < 2:
        return [pytest.param(LoweringParam(n), id=n) for n in names]
    n = items_per_lowering
    return [pytest.param(LoweringParam(name, (j, n)), id=f"{name}-shard{j + 1}of{n}") for name in names for j in range(n)]


@contextlib.contextmanager
def quiet_library_logs(level: int = logging.WARNING):
    """Log records below `level` are dropped for the block (a parity sweep calls flashinfer, torch and
    triton thousands of times: their INFO and DEBUG lines would bury a failure's verdict)."""
    before = logging.root.manager.disable
    logging.disable(max(before, level - 1))
    try:
        yield
    finally:
        logging.disable(before)


def failure_text(rep: Any, device: str) -> str:
    """The failed test's message: the lowering's notes and each failing case with its messages and JSON."""
    head = f"{rep.lowering} failed parity on {device}:"
    if not rep.failures and len(rep.extra) == 1:
        return f"{head} {rep.extra[0]}"
    lines = [head] + [f"  {n}" for n in rep.extra]
    for f in rep.failures:
        lines.append(f"  {'shrunk case' if f.shrunk else 'failing case (not shrunk)'}: {f.outcome.case.short()}")
        lines += [f"    - {m}" for m in f.outcome.failures]
        lines.append(f"    case JSON: {f.outcome.case.to_json(indent=None)}")
    return "\n".join(lines)


def work_dir(report_dir: Path | None, name: str, item: Item) -> Path | None:
    """Where this process writes a part's failure files and case in flight: a directory of its own under
    `<report>/parts/` (the controller moves the failure files into `<report>/failures/`)."""
    if report_dir is None:
        return None
    from parity.report.files import lowering_stem
    from parity.front.shards import shard_dir

    stem = lowering_stem(name)
    if item is not None:
        return shard_dir(report_dir, stem, item)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return report_dir / "parts" / f"{stem}.{worker}"


def record(parts: dict[tuple[str, Item], Any], name: str, item: Item, rep: Any) -> None:
    """Keep this check's report in `parts`; a lowering checked again in this process adds to its part."""
    key = (name, item)
    old = parts.get(key)
    if old is None:
        parts[key] = rep
        return
    old.add(rep)
    old.failures += rep.failures
    old.extra += rep.extra
    old.seconds += rep.seconds
    old.interrupted = old.interrupted or rep.interrupted
    if rep.status == "fail" or old.status == "unavailable":
        old.status = rep.status


def part_records(session: Any, parts: dict[tuple[str, Item], Any]) -> list[dict[str, Any]]:
    """This process's parts (of the `parity.front.session.CheckSession` `session`) as JSON: each one's entry
    (with its compile families) and the directory its failure files were written to."""
    from parity.report import files as report_mod
    from parity.front.shards import shard_part_entry

    kw = session.report_kw()
    out = []
    for (name, item), rep in parts.items():
        where = work_dir(session.report_dir, name, item)
        if where is not None:
            report_mod.write_failure_files(where, [rep], device=kw["device"], replay=kw["replay"],
                                           plugins=kw["plugins"])
        entry = shard_part_entry(rep.to_json(kw["replay"]), where, rep.compile_families)
        out.append({"lowering": name, "item": list(item) if item else None, "entry": entry,
                    "dir": str(where) if where is not None else None, "interrupted": rep.interrupted})
    return out


def merged_report(session: Any, parts: list[dict[str, Any]], jobs: int) -> tuple[dict[str, Any], bool]:
    """One report's data from the parts of every process (`jobs`: how many ran them), lowerings in the
    order they were first seen: a lowering's parts merged (`parity.front.parts.merge_lowering`), their failure
    files moved into the report; (data, whether a part was interrupted)."""
    from parity.front.parts import merge_lowering

    by_name: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        by_name.setdefault(p["lowering"], []).append(p)
    names = list(by_name)
    session.header_for(names, jobs=jobs)
    data = session.top()
    for name in names:
        ps = sorted(by_name[name], key=lambda p: tuple(p["item"] or (0, 0)))
        data["lowerings"][name] = merge_lowering(
            session.report_dir, name, [p["entry"] for p in ps], [Path(p["dir"]) for p in ps if p["dir"]],
            sharded=len(ps) > 1, keep_families=session.config.shard is not None)
    return data, any(p["interrupted"] for p in parts)
