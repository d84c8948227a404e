"""The report layer: what a run writes, and what is read back from users and from reports. It imports the
engine and below (the outcome model, the policy's ceilings, the ranges), never `parity.exec` nor a front end.

- writing a run's report: `files` (`parity.json` and its schema; `RunFiles`, `write_reports`,
  `write_merged`), `failure_files` (one file per shrunk failure, its replay command), `summary`
  (`summary.md`), `table` (the table of lowerings), `junit`, `lse` (what is said of an unchecked LSE),
  `escape` (plugin text made inert), `writing` (atomic writes, the JSON layout), `file_names`;
- the report directory: `directory` (held, locked, proven writable), `rundir` (no stale or half-written
  verdict in it), `provenance` (what the run checked: run id, times, settings, `--shard I/S`, verdict);
- reading back: `intake` (files a user hands over, refused by kind, size and nesting; a case by the memory
  it needs), `read` (a report read back), `trust` (its statuses and verdict recomputed);
- `merge` (shard reports into one), `gate` (the merge gate; its rules in `gate_rules` and
  `gate_lowerings`).
"""
