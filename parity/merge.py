"""`dflash-parity merge DIR... --report OUT`: one report from the reports of a run split over machines.

A sweep that outgrows one GPU box runs as S shards, `dflash-parity check --shard I/S` on S runners: shard
`I` draws the serial run's cases and judges those whose draw index is `I` modulo S (a lowering that
compiles: the cases of every S-th compile family; `parity.sweep.sharded_run_case`), so the S shards of a
derandomized profile judge each case of the serial run once. A failure is shrunk in the shard that finds
it. `merge_reports` checks that the S reports are the shards 0..S-1 of one run (the same settings but
`shard`, the same policy, plugins, torch and commit; anything else is refused naming the report and the
field) and that none is unfinished, then merges each lowering's entries with the one merge of
`parity.outcome` (counts add up, the worst figures are the worst of any shard), copies the failure files
into `OUT/failures/` (numbered as a serial run numbers them; the inputs are left as they are) and writes
junit.xml, summary.md and parity.json as `check` does. Its `settings` are the shards' without `shard`, so
`dflash-parity gate` compares it with a serial baseline like with like.

Equal to a serial run: verdicts, case counts, worst figures, the shrunk failures, when no lowering
fails. When one fails, the shards that did not find the failure go on drawing past it: counts then exceed
the serial run's and a shard may find (and shrink) another failing case; the verdict is the same.

Public: `merge_reports(dirs, out) -> data`, `load_shards`, `copy_failures`, `IGNORED_SETTINGS`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Sequence

from oracle.errors import InvalidInput

IGNORED_SETTINGS = ("shard", "jobs", "shards", "device_name")  # may differ between the shards of one run
_SAME_TOP = ("device", "profile", "torch", "tolerances")


def _shard_of(data: dict[str, Any], where: str) -> tuple[int, int]:
    from parity.config import parse_shard

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


def load_shards(dirs: Sequence[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The shard reports in shard order, checked to be the S shards of one run (see the module docstring)."""
    from parity import gate

    if not dirs:
        raise InvalidInput("DIR", "give the report directories of the shards")
    loaded = []
    for d in dirs:
        why = gate.unfinished(d)
        if why:
            raise InvalidInput(f"REPORT {d}", why)
        data = gate.load_report(d, "REPORT")
        loaded.append((gate.report_path(d), data, _shard_of(data, f"REPORT {d}")))
    counts = {s[1] for _, _, s in loaded}
    if len(counts) != 1:
        raise InvalidInput("REPORT", f"the reports are shards of runs split in different counts {sorted(counts)}: "
                                     f"give the S reports of one run")
    total = counts.pop()
    seen: dict[int, Path] = {}
    for path, _, (i, _) in loaded:
        if i in seen:
            raise InvalidInput(f"REPORT {path}", f"shard {i}/{total} given twice (also {seen[i]})")
        seen[i] = path
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
        _same(ref.get("policy"), data.get("policy"), str(path), str(ref_path), "policy")
        _same([p.get("sha256") for p in ref.get("plugins", [])], [p.get("sha256") for p in data.get("plugins", [])],
              str(path), str(ref_path), "plugins")
        _same((ref.get("git") or {}).get("commit"), (data.get("git") or {}).get("commit"), str(path), str(ref_path),
              "git.commit")
        _same(list(ref["lowerings"]), list(data["lowerings"]), str(path), str(ref_path), "lowerings")
    return [(p, d) for p, d, _ in loaded]


def copy_failures(out: Path, name: str, entry: dict[str, Any], sources: list[tuple[Any, Path]]) -> None:
    """Copy each failure file of the merged `entry` (from the shard report that found its case: `sources`
    holds `(case JSON, shard report directory)` of every shard's failures, in shard order) to
    `OUT/failures/<stem>-<n>.json`, its `file` and replay command pointing there."""
    from parity.report import atomic_write, dumps, failure_filename, replay_command

    for n, f in enumerate(entry.get("failures", []), 1):
        rel = f"failures/{failure_filename(name, n)}"
        src = next((d for case, d in sources if case == f.get("case")), None)
        old = src / f.get("file", "") if src is not None else None
        if old is not None and old.is_file():
            try:
                saved = json.loads(old.read_text())
                saved["replay"] = replay_command(out / rel, f.get("replay_args"))
                atomic_write(out / rel, dumps(saved) + "\n")
            except (OSError, ValueError):
                shutil.copyfile(old, out / rel)
        f["file"] = rel


def merge_reports(dirs: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Merge the shard reports in `dirs` into the report directory `out` (see the module docstring); the
    merged report data."""
    from parity import provenance, report_dir, rundir
    from parity.outcome import FAMILY_KEYS, merge_entries
    from parity.report import lowering_stem, write_merged

    shards = load_shards(dirs)
    out = Path(out)
    inputs = {p.parent.resolve() for p, _ in shards}
    if out.resolve() in inputs:
        raise InvalidInput(f"--report {out}", "is one of the shard reports; merge into another directory")
    ref = shards[0][1]
    data = {k: v for k, v in ref.items() if k not in ("lowerings", "verdict", "finished", "created",
                                                      "tolerances_unmatched")}
    data["run_id"] = provenance.new_run_id()
    data["started"] = min(d["started"] for _, d in shards)
    data["settings"] = {k: v for k, v in ref["settings"].items() if k != "shard"}
    data["merged_from"] = [{"report": str(p), "run_id": d["run_id"], "shard": d["settings"]["shard"]}
                           for p, d in shards]
    data["lowerings"] = {}
    d = report_dir.prepare(out)
    with report_dir.locked(d):
        rundir.begin(d, data["run_id"], data["started"])
        for stem in {lowering_stem(n) for n in ref["lowerings"]}:
            for old in (d / "failures").glob(f"{stem}-*.json"):
                old.unlink()
        for name in ref["lowerings"]:
            entries = [dict(s[1]["lowerings"][name]) for s in shards]
            sources = [(f.get("case"), p.parent) for p, s in shards for f in s["lowerings"][name].get("failures", [])]
            entry = merge_entries(entries, name)
            entry.pop(FAMILY_KEYS, None)
            copy_failures(d, name, entry, sources)
            data["lowerings"][name] = entry
        unmatched = [set(s.get("tolerances_unmatched", [])) for _, s in shards]
        if all("tolerances_unmatched" in s for _, s in shards):  # unmatched by every shard: by the run
            data["tolerances_unmatched"] = [e for e in ref["tolerances_unmatched"] if all(e in u for u in unmatched)]
        data = provenance.finish(data, interrupted=any(s.get("verdict") == "interrupted" for _, s in shards))
        write_merged(d, data)
        rundir.end(d, data["run_id"])
    return data
