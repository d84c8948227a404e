"""`dflash-parity merge DIR... --report OUT`: one report from the reports of a run split over machines.

A sweep that outgrows one GPU box runs as S shards, `dflash-parity check --shard I/S` on S runners: shard
`I` draws the serial run's cases and judges those whose draw index is `I` modulo S (a lowering that
compiles: the cases of every S-th compile family; `parity.engine.sweep.sharded_run_case`), so the S shards of a
derandomized profile judge each case of the serial run once. A failure is shrunk in the shard that finds
it. `merge_reports` merges each lowering's entries with the one merge of `parity.engine.outcome` (counts add up,
the worst figures are the worst of any shard), copies the failure files into `OUT/failures/` (numbered as
a serial run numbers them; the inputs are left as they are) and writes junit.xml, summary.md and
parity.json as `check` does. Its `settings` are the shards' without `shard`, so `dflash-parity gate`
compares it with a serial baseline like with like.

A shard report is input, not a verdict to take on trust (`load_shards`); one `InvalidInput` naming the
report and the field refuses the merge (exit 2) before `OUT` is touched:
- sizes first: at most `parity.engine.ranges.MAX_RUN_SHARDS` reports, their `parity.json` files together at
  most `MAX_MERGE_BYTES` (from their sizes on disk, before one is read), each read by
  `parity.report.read.load_report` (a finished version-2 report, finite figures, at most 256 MiB), and S
  in `settings.shard` at most `MAX_RUN_SHARDS`;
- a partition of one run: the same S, each index once, every index present, no run id twice (a copy of
  one shard relabelled as another), the same settings (but `IGNORED_SETTINGS`, the facts of a machine:
  its cores, its device name, how it split its own work), the same policy by content (its sha256 and
  bounds; where the file lies may differ), the same plugins by sha256, torch, profile and commit;
  anything else names the shard that does not belong;
- every failure file a shard names resolves (links followed) inside that shard's report directory, and
  is a regular file of bounded size (`../../x`, an absolute path or a link out is refused); every file
  written resolves inside `OUT`;
- the verdict is recomputed: each shard entry's status from its cases and failures
  (`parity.report.trust.entry_status`: a `"status": "pass"` listing failures is a failure), the merged
  verdict from the merged entries; a shard's recorded `verdict` only ever makes it worse (interrupted).

Equal to a serial run: verdicts, case counts, worst figures, the shrunk failures, when no lowering
fails. When one fails, the shards that did not find the failure go on drawing past it: counts then exceed
the serial run's and a shard may find (and shrink) another failing case; the verdict is the same.

Public: `merge_reports(dirs, out) -> data`, `load_shards`, `copy_failures`, `IGNORED_SETTINGS`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from oracle.errors import InvalidInput
from parity.engine import ranges
from parity.engine.outcome import FAMILY_KEYS, merge_entries
from parity.report import directory as report_dir, provenance, rundir
from parity.report.failure_files import replay_command
from parity.report.file_names import check_distinct, failure_filename, lowering_stem, stem_files
from parity.report.files import write_merged
from parity.report.intake import read_json
from parity.report.provenance import parse_shard
from parity.report.read import load_report, report_path, unfinished
from parity.report.writing import atomic_write, dumps

IGNORED_SETTINGS = ("shard", "jobs", "shards", "device_name", "threads", "mps")  # may differ between shards
_SAME_TOP = ("device", "profile", "torch")


def _shard_of(data: dict[str, Any], where: str) -> tuple[int, int]:
    text = data["settings"].get("shard")
    if text is None:
        raise InvalidInput(f"{where}: settings.shard", "not a shard of a run (it was not checked with --shard I/S); "
                                                       "merge reads the reports of `dflash-parity check --shard I/S`")
    return parse_shard(text, f"{where}: settings.shard")


def _same(ref: Any, got: Any, where: str, ref_where: str, what: str) -> None:
    if ref != got:
        raise InvalidInput(f"{where}: {what}", f"{_short(got)} here, {_short(ref)} in {ref_where}: the shards of one run "
                                               f"are checked with the same settings, policy, plugins and commit")


def _short(x: Any) -> str:
    text = json.dumps(x, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def _sizes(dirs: Sequence[str | Path]) -> None:
    """The count of shard reports and their bytes on disk, bounded before any is read."""
    if not dirs:
        raise InvalidInput("DIR", "give the report directories of the shards")
    if len(dirs) > ranges.MAX_RUN_SHARDS:
        raise InvalidInput("DIR", f"{len(dirs)} shard reports given; a run is split in at most "
                                  f"{ranges.MAX_RUN_SHARDS} shards")
    total = 0
    for d in dirs:
        try:
            total += os.stat(report_path(d)).st_size
        except OSError:
            continue  # load_report names it
    if total > ranges.MAX_MERGE_BYTES:
        raise InvalidInput("DIR", f"the shard reports hold {total} bytes together, more than the "
                                  f"{ranges.MAX_MERGE_BYTES} one merge reads")


def inside(base: Path, rel: Any, where: str) -> Path:
    """`base / rel` with links followed, refused (`InvalidInput` naming `where`) unless it lies inside
    `base` (also resolved)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise InvalidInput(where, f"a file name inside the report directory, got {_short(rel)}")
    root = Path(base).resolve()
    path = (root / rel).resolve()
    if path != root and root not in path.parents:
        raise InvalidInput(where, f"{rel!r} resolves to {path}, outside the report directory {root}: merge reads "
                                  f"and writes only inside the report directories it is given")
    return path


def _failure_files(path: Path, data: dict[str, Any], where: str) -> None:
    """Every failure file the shard names, resolved inside its directory (see the module docstring)."""
    for name, v in data["lowerings"].items():
        for n, f in enumerate(v.get("failures", [])):
            at = f"{where}: lowerings.{name}.failures[{n}].file"
            if not isinstance(f, dict):
                raise InvalidInput(at, "a failure entry is an object")
            inside(path.parent, f.get("file"), at)


def load_shards(dirs: Sequence[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The shard reports in shard order, checked to be the S shards of one run (see the module docstring)."""
    _sizes(dirs)
    loaded = []
    for d in dirs:
        why = unfinished(d)
        if why:
            raise InvalidInput(f"REPORT {d}", why)
        data = load_report(d, "REPORT")
        loaded.append((report_path(d), data, _shard_of(data, f"REPORT {d}")))
    counts = {s[1] for _, _, s in loaded}
    if len(counts) != 1:
        raise InvalidInput("REPORT", f"the reports are shards of runs split in different counts {sorted(counts)}: "
                                     f"give the S reports of one run")
    total = counts.pop()
    seen: dict[int, Path] = {}
    runs: dict[str, Path] = {}
    for path, data, (i, _) in loaded:
        if i in seen:
            raise InvalidInput(f"REPORT {path}", f"shard {i}/{total} given twice (also {seen[i]})")
        seen[i] = path
        if data["run_id"] in runs:
            raise InvalidInput(f"REPORT {path}", f"shard {i}/{total} is a copy of another shard's report: its run "
                                                 f"{data['run_id']} is also the run of {runs[data['run_id']]} (a shard "
                                                 f"relabelled?); each shard is a check run of its own")
        runs[data["run_id"]] = path
    missing = sorted(set(range(total)) - set(seen))
    if missing:
        raise InvalidInput("REPORT", f"shard(s) {', '.join(f'{i}/{total}' for i in missing)} missing: a run split in "
                                     f"{total} shards merges from all {total} reports")
    loaded.sort(key=lambda x: x[2][0])
    ref_path, ref, _ = loaded[0]
    for path, data, _ in loaded[1:]:
        for key in _SAME_TOP:
            _same(ref.get(key), data.get(key), str(path), str(ref_path), key)
        for key in sorted(set(ref["settings"]) | set(data["settings"])):
            if key not in IGNORED_SETTINGS:
                _same(ref["settings"].get(key), data["settings"].get(key), str(path), str(ref_path), f"settings.{key}")
        _same(_policy(ref), _policy(data), str(path), str(ref_path), "policy")
        _same([p.get("sha256") for p in ref.get("plugins", [])], [p.get("sha256") for p in data.get("plugins", [])],
              str(path), str(ref_path), "plugins")
        _same((ref.get("git") or {}).get("commit"), (data.get("git") or {}).get("commit"), str(path), str(ref_path),
              "git.commit")
        _same(list(ref["lowerings"]), list(data["lowerings"]), str(path), str(ref_path), "lowerings")
    for path, data, _ in loaded:
        _failure_files(path, data, f"REPORT {path}")
    return [(p, d) for p, d, _ in loaded]


def _policy(data: dict[str, Any]) -> dict[str, Any]:
    """The policy a shard recorded, but where its file lay (its content hash and bounds decide)."""
    return {k: v for k, v in data.get("policy", {}).items() if k != "file"}


def copy_failures(out: Path, name: str, entry: dict[str, Any], sources: list[tuple[Any, Path]]) -> None:
    """Copy each failure file of the merged `entry` (from the shard report that found its case: `sources`
    holds `(case JSON, shard report directory)` of every shard's failures, in shard order) to
    `OUT/failures/<stem>-<n>.json`, its `file` and replay command pointing there. Each file is read
    inside its shard's directory and written inside `out` (`inside`), read as JSON of bounded size."""
    for n, f in enumerate(entry.get("failures", []), 1):
        rel = f"failures/{failure_filename(name, n)}"
        dest = inside(out, rel, f"--report {out}")
        src = next((d for case, d in sources if case == f.get("case")), None)
        old = inside(src, f.get("file"), f"REPORT {src}: lowerings.{name}.failures") if src is not None else None
        if old is not None and old.is_file():
            saved = read_json(old, "failure file")
            if isinstance(saved, dict):
                saved["replay"] = replay_command(out / rel, f.get("replay_args"))
            atomic_write(dest, dumps(saved) + "\n")
        f["file"] = rel


def merge_reports(dirs: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Merge the shard reports in `dirs` into the report directory `out` (see the module docstring); the
    merged report data."""
    if not str(out):
        raise InvalidInput("--report", "an empty path: give the merged report's directory")
    shards = load_shards(dirs)
    out = Path(out)
    inputs = {p.parent.resolve() for p, _ in shards}
    if out.resolve() in inputs:
        raise InvalidInput(f"--report {out}", "is one of the shard reports; merge into another directory")
    ref = shards[0][1]
    check_distinct(list(ref["lowerings"]), f"REPORT {shards[0][0]}: lowerings")
    data = {k: v for k, v in ref.items() if k not in ("lowerings", "verdict", "finished", "created",
                                                      "tolerances_unmatched")}
    data["run_id"] = provenance.new_run_id()
    data["started"] = min(d["started"] for _, d in shards)
    data["settings"] = {k: v for k, v in ref["settings"].items() if k != "shard"}
    data["merged_from"] = [{"report": str(p), "run_id": d["run_id"], "shard": d["settings"]["shard"]}
                           for p, d in shards]
    data["lowerings"] = {}
    with report_dir.taken(out) as d:
        rundir.begin(d, data["run_id"], data["started"])
        for name in ref["lowerings"]:
            for old in stem_files(d / "failures", lowering_stem(name)):
                old.unlink()
        for name in ref["lowerings"]:
            entries = [dict(s[1]["lowerings"][name]) for s in shards]  # statuses recomputed (load_report)
            sources = [(f.get("case"), p.parent) for p, s in shards for f in s["lowerings"][name].get("failures", [])]
            entry = merge_entries(entries, name)
            entry.pop(FAMILY_KEYS, None)
            copy_failures(d, name, entry, sources)
            data["lowerings"][name] = entry
        unmatched = [set(s.get("tolerances_unmatched", [])) for _, s in shards]
        if all("tolerances_unmatched" in s for _, s in shards):  # unmatched by every shard: by the run
            data["tolerances_unmatched"] = [e for e in ref["tolerances_unmatched"] if all(e in u for u in unmatched)]
        interrupted = any(s.get("verdict") == "interrupted" or any(v.get("interrupted") for v in s["lowerings"].values())
                          for _, s in shards)
        data = provenance.finish(data, interrupted=interrupted)
        write_merged(d, data)
        rundir.end(d, data["run_id"])
    return data
