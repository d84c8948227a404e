"""The report steps of a check session (`parity.front.session.CheckSession` has them): its directory, its header, its
files, its gate. Each step is `parity.report`'s; the session says when.

- `holding_report_dir()`: the directory prepared and locked (`parity.report.directory`); `start_run()`: marked in
  progress (`parity.report.rundir`); `header_for(names)`: the report's header (`parity.report.provenance`);
- `saved_failures(name)`: the lowering's saved failure files and the case a previous run left in flight, read back
  as a user's case file is (`parity.front.intake`);
- `write(reports)` (one process) or `write_parts(data)` (the merged parts of other processes,
  `parity.front.parts`): failure files, junit.xml, summary.md, then parity.json; `write_progress(reports)` between
  lowerings; `end()` unmarks the directory; `gate()` compares the written report with `gate_baseline`.

Public: `ReportSteps`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Sequence

from parity.engine import yardstick
from parity.exec.inflight import inflight_path
from parity.front.intake import check_case_fits, read_case_file
from parity.report import directory as report_dir_mod
from parity.report import files as report_mod
from parity.report import gate as gate_mod
from parity.report import provenance, rundir
from parity.report.file_names import lowering_stem, stem_files

Shard = tuple[int, int]


class ReportSteps:
    """The report steps of `CheckSession` (see the module docstring); they read the session's `config`,
    `report_dir`, `device`, `policy`, `plugin_of`, `threads`, `mps_status`, `run_id`, `started`, `header`."""

    @contextlib.contextmanager
    def holding_report_dir(self) -> Iterator[None]:
        """The report directory free of links out of it, locked against another check, the previous run's
        verdict moved out of the gate's way and the directory proven writable, for the block
        (`parity.report.directory.taken`; nothing when the session writes no report)."""
        if self.report_dir is None:
            yield
            return
        with report_dir_mod.taken(self.report_dir) as d:
            (d / report_mod.PARTIAL_NAME).unlink(missing_ok=True)
            yield

    def run_settings(self, names: Sequence[str], **extra: Any) -> dict[str, Any]:
        """The report's `settings` (`parity.report.provenance.run_settings`) for the lowerings `names`."""
        extra.setdefault("threads", self.threads)
        extra.setdefault("yardstick", yardstick.DEFAULT)  # what the yardstick rule measured against
        if self.mps_status is not None:  # `--mps`: what parity.exec.mps did
            extra.setdefault("mps", self.mps_status)
        return provenance.run_settings(self.config, device=self.device, settings=self.config.hypothesis_settings(),
                                       lowerings=names, **extra)

    def start_run(self) -> None:
        """The run's id and start time; the report directory marked in progress (`parity.report.rundir`)."""
        self.run_id, self.started = provenance.new_run_id(), provenance.now()
        if self.report_dir is not None:
            report_dir_mod.written(self.report_dir, rundir.begin, self.report_dir, self.run_id, self.started)

    def header_for(self, names: Sequence[str], **settings_extra: Any) -> None:
        """The report's header (`parity.report.provenance.run_header`) for the lowerings `names`."""
        if self.run_id is None:
            self.run_id, self.started = provenance.new_run_id(), provenance.now()
        self.header = provenance.run_header(run_id=self.run_id, started=self.started, device=self.device,
                                            profile=self.config.profile, policy=self.policy, lowerings=list(names),
                                            plugins=list(self.config.plugins),
                                            settings=self.run_settings(names, **settings_extra))

    def end(self) -> None:
        """The report directory no longer marked in progress (its verdict is written)."""
        if self.run_id is not None and self.report_dir is not None:
            rundir.end(self.report_dir, self.run_id)

    def saved_failures(self, name: str, shard: Shard | None = None) -> list:
        """The lowering's saved failure files and the case a previous run left in flight (each checked as a
        case file a user gives is; a bad one raises InvalidInput naming it), in shard 0 only."""
        if self.report_dir is None or (shard is not None and shard[0] != 0):
            return []
        files = stem_files(self.report_dir / "failures", lowering_stem(name))
        inflight = inflight_path(self.report_dir / "inflight", name)
        if inflight.exists() or inflight.is_symlink():
            files.append(inflight)
        out = []
        for f in files:
            case, wrapper = read_case_file(f)
            if wrapper.get("lowering") != name or case in out:  # another lowering's file of the same stem
                continue
            check_case_fits(case, self.device, str(f))
            out.append(case)
        return out

    def report_kw(self) -> dict[str, Any]:
        return dict(device=self.device, profile=self.config.profile, tolerances=self.policy.source,
                    replay=report_mod.replay_args(self.device, self.config.tolerances),
                    plugins={name: report_mod.plugin_records([path]) for name, path in self.plugin_of.items()})

    def write_progress(self, reports: list) -> None:
        """The lowerings finished so far on disk before the next one starts (a crash loses none)."""
        if self.report_dir is None:
            return
        kw = self.report_kw()
        try:
            report_mod.write_progress(self.report_dir, reports, device=kw["device"], profile=kw["profile"],
                                      tolerances=kw["tolerances"], replay=kw["replay"], plugins=kw["plugins"])
        except OSError as err:
            self.warn(f"dflash-parity: warning: could not write the progress report: {err}")

    def write(self, reports: list, *, part: Path | None = None, amend_part=None,
              work_dir: Path | None = None) -> dict[str, Any]:
        """The report of `reports` (run in this process): its files, or (`part`) a `--jobs` child's part,
        its failure files in `work_dir` (default: the report directory)."""
        kw = self.report_kw()
        if self.report_dir is None:
            return report_mod.to_json(reports, device=kw["device"], profile=kw["profile"],
                                      tolerances=kw["tolerances"], replay=kw["replay"], header=self.header,
                                      family_counts=self.config.shard is not None)
        return report_dir_mod.written(self.report_dir, report_mod.write_reports, work_dir or self.report_dir, reports,
                                      part=part, amend_part=amend_part, header=self.header,
                                      policy_entries=self.policy.entry_names(),
                                      family_counts=self.config.shard is not None, **kw)

    def write_parts(self, data: dict[str, Any], *, interrupted: bool) -> dict[str, Any]:
        """The report of merged parts (`parity.front.parts`): unmatched tolerance entries noted, the verdict
        stamped, junit.xml, summary.md and parity.json written."""
        report_mod.note_unmatched(data, self.policy.entry_names())
        data = provenance.finish(data, interrupted=interrupted)
        if self.report_dir is not None:
            report_dir_mod.written(self.report_dir, report_mod.write_merged, self.report_dir, data)
        return data

    def top(self) -> dict[str, Any]:
        """The top level of a report made of parts: the schema, this run's header."""
        return report_mod.to_json([], device=self.device, profile=self.config.profile,
                                  tolerances=self.policy.source, header=self.header)

    def gate(self):
        """`parity.report.gate` of the written report against `gate_baseline` (gate.md written next to it), or None."""
        if self.config.gate_baseline is None or self.report_dir is None:
            return None
        why = gate_mod.unfinished(self.config.gate_baseline)
        if why:
            res = gate_mod.unfinished_result([f"--gate-baseline: {why}"])
        else:
            base = gate_mod.load_report(self.config.gate_baseline, "--gate-baseline")
            new = gate_mod.load_report(self.report_dir, "the report")
            res = gate_mod.gate(base, new, accept=gate_mod.parse_accept(list(self.config.gate_accept)))
        report_mod.atomic_write(self.report_dir / "gate.md", res.markdown)
        return res
