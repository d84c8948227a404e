"""Reports of a `check` run: `parity.json` (versioned schema, below), `junit.xml` (`parity.report.junit`),
`summary.md` (`parity.report.summary`), one `failures/<lowering>-<n>.json` per shrunk failure
(`parity.report.failure_files`). Every file is written atomically (`parity.report.writing`), so a crash
never leaves half a report; `parity.json`, the verdict, is written last, so a run that fails to write the
others (a full disk) leaves none. A serial run of several lowerings writes each finished lowering's failure
files and `parity.partial.json` (the report so far, marked partial: never a verdict) before the next
lowering starts (`write_progress`).

- `to_json(reports, ...)`: the report data. `RunFiles(...)`: what the files say besides the lowerings'
  entries; its `write(dir, reports, ...)` writes them, or a `--jobs` child's part (`write_reports(dir,
  reports, **fields)`: the same, its fields by name). `write_merged(dir, data)`: the files of report data
  already made (merged parts, merged shards).
- The table and the summary's pieces (`table_rows`, `format_table`, `phase_line`, `oracle_line`,
  `summary_md`, `settings_line`, `unmatched_line`), the failure files' (`replay_args`, `replay_command`,
  `plugin_records`, `file_sha256`), the writing (`atomic_write`, `dumps`) and `junit_xml` are public here too.

`parity.json` schema (version 2; version 1 lacked everything from `run_id` to `verdict`):

    {"schema": "dflash-parity/report", "version": 2, "created": ISO-8601 (= finished), "device": str,
     "profile": str, "torch": str, "tolerances": path,
     "run_id": hex, "started": ISO-8601, "finished": ISO-8601,
     "verdict": "pass"|"fail"|"interrupted"|"nothing judged" (parity.report.provenance.verdict_of),
     "git": {"commit": sha, "dirty": bool}|null,
     "settings": {"lowerings": [NAME], "device", "device_name", "profile", "seed", "derandomized",
        "max_examples", "hardening": bool, "isolation": bool, "case_timeout", "kernel_names_every",
        "limits": [str], "jobs", "shards": [str], "warm_up", "allow_loose_bounds", "allow_nothing_judged", "threads",
        "yardstick",
        "shard": "I/S" (optional: --shard), "flaky_runs": int (optional)},
     "merged_from": [{"report", "run_id", "shard"}] (optional: `dflash-parity merge`),
     "plugins": [{"path": str, "sha256": hex}],
     "policy": {"file": path, "sha256": hex, "max_margin_growth": float, "allow_loose_bounds": bool,
        "ceilings": {KEY: {DTYPE: float}},
        "bounds": {NAME: {DTYPE: {KEY: {"value": float, "source": TABLE, "reason": str}}}},
        "overrides": {TABLE: {"values": {KEY: float}, "reason": str, "measured_in": [str]}}},
     "lowerings": {NAME: {"status": "pass"|"fail"|"unavailable", "reason": str, "cases": int,
        "passed": int, "unsupported": int, "judged": int (cases - unsupported), "calls_checked": int,
        "seconds": float,
        "worst_margin": float, "worst_case": CASE|null, "worst_figures": {...},
        "worst_ulp": float, "worst_ulp_case": CASE|null, "worst_rel_l2": float, "worst_rel_l2_case": CASE|null,
        "compiles": {kernel: int}, "compile_families": int, "max_compiles_in_a_family": int,
        "max_compiles": int|null (the bound per shape family),
        "classes": {CLASS: {"cases": int, "failed": int}}, "notes": [str], "interrupted": true (only when a signal stopped it),
        "phase_seconds": {PHASE: float} (summed over cases; PHASE in parity.engine.outcome.PHASES; optional),
        "lse_checked": false (only when the lowering declares no LSE, `lse_base = None`: its output judged
                  alone; parity.report.lse),
        "drawn": {"context": {BUCKET: int}, "dtype": {...}, "kv_dtype": {...}, "head_dim": {...},
                  "pools_past_2^31": int, "extremes": {...}} (what was drawn, parity.engine.drawn; optional),
        "skipped": {CHECK: {"cases": int, "why": str}} (hardening steps left out for lack of device
                  memory, parity.exec.memory; optional),
        "retried": {"out of device memory": {"cases": int, "why": str}} (cases that ran out of device memory
                  beside other processes and were judged again alone, parity.engine.case_run; only when some were),
        "shards": int (optional: the lowering ran in this many shard processes, parity.exec.shards),
        "bounds": {ENTRY: {"cases": int, "why": str}} (the tolerance entries that set its cases' bounds,
                  parity.engine.policy.ToleranceSource.label, and why they applied; optional),
        "failures": [{"file": str, "shrunk": bool, "case": CASE, "failures": [str], "example": str,
                      "figures": {...} (the failing case's; optional), "replay_args": [str] (optional),
                      "runs": str ("failed k of R runs"; optional), "classification": {...} (optional,
                      parity.engine.flakiness.Classification.to_json), "sanitizer": str (optional), "slip": str
                      (optional: a shrink that slipped from this failure or to it, parity.engine.slips)}]}},
     "tolerances_unmatched": [ENTRY] (optional: tolerances.toml entries that matched no case in this run)}

CASE is a case's JSON object (oracle.case.Case.to_json_dict); CLASS is `dtype/kv_dtype/kind/layout/storage`.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from parity.engine.outcome import LoweringReport
from parity.report.provenance import finish
from parity.report.writing import atomic_write, dumps
from parity.report.failure_files import write_failure_files
from parity.report.junit import junit_xml
from parity.report.summary import summary_md
# public here too: the names the report's writers and readers have always imported from this module
from parity.report.failure_files import file_sha256, plugin_records, replay_args, replay_command  # noqa: F401
from parity.report.file_names import failure_filename, lowering_stem  # noqa: F401
from parity.report.summary import settings_line, unmatched_line  # noqa: F401
from parity.report.table import format_table, oracle_line, phase_line, table_rows  # noqa: F401

SCHEMA = "dflash-parity/report"
SCHEMA_VERSION = 2
PARTIAL_NAME = "parity.partial.json"


def to_json(reports: list[LoweringReport], *, device: str, profile: str, tolerances: str,
            replay: list[str] | None = None, header: dict[str, Any] | None = None,
            family_counts: bool = False) -> dict[str, Any]:
    """Report data; `header` (parity.report.provenance.run_header) adds what the run checked; `replay`: the
    options each failure's replay command needs (`replay_args`); `family_counts`: each entry keeps its
    per-family compile counts (a report that is one shard of a run, for `dflash-parity merge`)."""
    out: dict[str, Any] = {
        "schema": SCHEMA, "version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device, "profile": profile, "torch": torch.__version__, "tolerances": tolerances,
    }
    out.update(header or {})
    out["lowerings"] = {r.lowering: r.to_json(replay, family_counts=family_counts) for r in reports}
    return out


def note_unmatched(data: dict[str, Any], entries: list[str]) -> list[str]:
    """Record in `data` (and return) the tolerance entries no case of this run's lowerings used. An entry
    used by some case is listed in some lowering's `bounds` label (`a + b` when several applied)."""
    used: set[str] = set()
    for v in data.get("lowerings", {}).values():
        for label in v.get("bounds", {}):
            used.update(label.split(" + "))
    unmatched = [e for e in entries if e not in used]
    data["tolerances_unmatched"] = unmatched
    return unmatched


def write_progress(report_dir: str | Path, reports: list[LoweringReport], *, device: str, profile: str,
                   tolerances: str, replay: list[str] | None = None,
                   plugins: dict[str, list[dict[str, str]]] | None = None) -> None:
    """The lowerings finished so far: their failure files and `parity.partial.json` (marked partial, never
    a verdict), so that a crash of this process in the next lowering loses none of them."""
    d = Path(report_dir)
    write_failure_files(d, reports, device=device, replay=replay, plugins=plugins)
    data = to_json(reports, device=device, profile=profile, tolerances=tolerances, replay=replay)
    data["partial"] = "the run was still going (or died) after these lowerings: not a verdict"
    atomic_write(d / PARTIAL_NAME, dumps(data) + "\n")


@dataclass(frozen=True)
class RunFiles:
    """What a run's report files say besides its lowerings' entries, and their writer: the `device`,
    `profile` and policy file (`tolerances`) it checked with; `replay`: the options each failure's replay
    command needs (`replay_args`); `plugins`: lowering -> `plugin_records` (written into its failure files);
    `header`: `parity.report.provenance.run_header`; `family_counts`: each entry keeps its per-family
    compile counts (one shard of a run, for `dflash-parity merge`)."""

    device: str
    profile: str
    tolerances: str
    replay: list[str] | None = None
    plugins: dict[str, list[dict[str, str]]] | None = None
    header: dict[str, Any] | None = None
    family_counts: bool = False

    def data(self, reports: list[LoweringReport]) -> dict[str, Any]:
        """`to_json` of `reports` with these facts."""
        return to_json(reports, device=self.device, profile=self.profile, tolerances=self.tolerances,
                       replay=self.replay, header=self.header, family_counts=self.family_counts)

    def write(self, report_dir: str | Path, reports: list[LoweringReport], *, part: Path | None = None,
              amend_part: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              policy_entries: list[str] | None = None) -> dict[str, Any]:
        """Failure files (the lowerings' old ones removed), then `junit.xml`, `summary.md` and `parity.json`
        (stamped with its verdict, `parity.report.provenance.finish`); the report data. With `part` (a
        `--jobs` child), the failure files and the report data at `part` only (parity.exec.jobs merges the
        parts), each entry passed through `amend_part(entry) -> entry` first when given (a shard's,
        `parity.exec.shards`). `policy_entries` (`Policy.entry_names()`): those no case used are listed
        (`note_unmatched`), not in a part."""
        d = Path(report_dir)
        data = self.data(reports)
        if policy_entries is not None and part is None:
            note_unmatched(data, policy_entries)
        write_failure_files(d, reports, device=self.device, replay=self.replay, plugins=self.plugins)
        if part is not None:
            if amend_part is not None:
                data["lowerings"] = {k: amend_part(v) for k, v in data["lowerings"].items()}
            atomic_write(Path(part), dumps(data) + "\n")
            return data
        write_merged(d, finish(data, interrupted=any(r.interrupted for r in reports)))
        return data


def write_reports(report_dir: str | Path, reports: list[LoweringReport], *, part: Path | None = None,
                  amend_part: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                  policy_entries: list[str] | None = None, **run: Any) -> dict[str, Any]:
    """`RunFiles(**run).write(report_dir, reports, part=..., amend_part=..., policy_entries=...)`: the
    report's files (see `RunFiles.write`), `run` naming the fields of `RunFiles` one by one (`device`,
    `profile`, `tolerances` required; a missing or unknown one is a TypeError, as for any signature)."""
    return RunFiles(**run).write(report_dir, reports, part=part, amend_part=amend_part,
                                 policy_entries=policy_entries)


def write_merged(report_dir: str | Path, data: dict[str, Any]) -> None:
    """`junit.xml`, `summary.md`, then `parity.json` (the verdict, last) from report data (one run's, or
    merged parts); the run's `parity.partial.json`, if any, goes."""
    d = Path(report_dir)
    atomic_write(d / "junit.xml", junit_xml(data))
    atomic_write(d / "summary.md", summary_md(data, report_dir=d))
    atomic_write(d / "parity.json", dumps(data) + "\n")
    (d / PARTIAL_NAME).unlink(missing_ok=True)
