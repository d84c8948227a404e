"""`dflash-parity check --jobs N`: a session's lowerings checked side by side, one child process per part.

Here the children are made (`parity.front.part`: one lowering each, or one shard of a lowering `--shards NAME=S`
splits, the shards started first: they are the slow ones), the files an earlier run left for them removed, `--mps`
settled (`parity.exec.mps`), and the children run (`parity.exec.jobs.run_jobs`: the process pool, the GPUs, the
prefork); then their parts merge into the run's report (`parity.front.parts.merge_parts`), with the session's header
on top. A child that wrote no part is a failed entry saying why; lowerings never started (interrupted) say so.

Public: `run_jobs(session, names, shards=None) -> (data, interrupted)`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from parity.exec import jobs as jobs_mod
from parity.exec import mps as mps_mod
from parity.exec.gpus import GpuSlots, visible_gpus
from parity.exec.pool import child_env
from parity.front import shards as shards_mod
from parity.front.part import CHILD_PRELOAD, Part, child_argv
from parity.front.parts import merge_parts, part_path, shared_draws_path, workers_cpu_path
from parity.report.file_names import lowering_stem


def _parts(names: Sequence[str], shards: dict[str, int]) -> list[Part]:
    """The children's parts: the sharded lowerings' shards first (the slow ones), then the others."""
    tasks = [Part(n, (i, shards[n])) for n in names if n in shards for i in range(shards[n])]
    return tasks + [Part(n) for n in names if n not in shards]


def _forget_earlier(report_dir: Path, tasks: list[Part]) -> None:
    """What an earlier run left for these parts: a part of it must never pass for this run's."""
    for t in tasks:
        part_path(report_dir, t.lowering, t.shard).unlink(missing_ok=True)
        if t.shard is not None:
            shutil.rmtree(shards_mod.shard_dir(report_dir, lowering_stem(t.lowering), t.shard), ignore_errors=True)
            shared_draws_path(report_dir, t.lowering, t.shard[1]).unlink(missing_ok=True)


def _job(config: Any, report_dir: Path, part: Part) -> jobs_mod.Job:
    return jobs_mod.Job(label=shards_mod.shard_label(part.lowering, part.shard), argv=tuple(child_argv(config, part)),
                        log=part_path(report_dir, part.lowering, part.shard).with_suffix(".log"),
                        workers_cpu=workers_cpu_path(report_dir, part.lowering, part.shard))


def run_jobs(session: Any, names: Sequence[str], shards: dict[str, int] | None = None, *, poll: float = 0.2,
             grace: float = 60.0) -> tuple[dict[str, Any], bool]:
    """Check `names` in up to `session.config.jobs` child processes (`shards[name]` of them for a sharded
    lowering); returns (merged report data, interrupted).

    On KeyboardInterrupt each running child gets SIGTERM and up to `grace` seconds to write its partial part
    (its lowering then fails as "interrupted after N cases"); lowerings not yet started are reported as
    never started. The merged report is returned either way, with the session's header on top."""
    config, report_dir = session.config, Path(session.config.report)
    (report_dir / "parts").mkdir(parents=True, exist_ok=True)
    shards = {k: v for k, v in (shards or {}).items() if v > 1}
    tasks = _parts(names, shards)
    _forget_earlier(report_dir, tasks)
    gpus = GpuSlots(visible_gpus() if session.device == "cuda" else 0, os.environ.get("CUDA_VISIBLE_DEVICES"))
    per_gpu = mps_mod.processes_per_gpu(min(config.jobs, len(tasks)), gpus.count)
    try:
        with _mps_for(session, per_gpu) as mps:
            exits, interrupted = jobs_mod.run_jobs(
                [_job(config, report_dir, t) for t in tasks], processes=config.jobs,
                env=child_env(config.jobs, mps=mps.env), gpus=gpus, say=session.say, poll=poll, grace=grace,
                preload=CHILD_PRELOAD if config.jobs_start == "prefork" else None)
            data = merge_parts(report_dir, names, exits, session.top(), shards,
                               keep_families=config.shard is not None)
            return data, interrupted
    finally:  # the shards' shared draws (parity.exec.draw_ahead.SharedDraws): read by now, or never to be
        for t in tasks:
            if t.shard is not None:
                shared_draws_path(report_dir, t.lowering, t.shard[1]).unlink(missing_ok=True)


def _mps_for(session: Any, per_gpu: int):
    """`parity.exec.mps.mps_session` under `--mps` (its status in the report's `settings.mps`); else a no-op, with
    the note that MPS exists when several processes share a GPU."""
    if not getattr(session.config, "mps", False):
        if session.device == "cuda":
            hint = mps_mod.mps_hint(per_gpu)
            if hint:
                session.say(f"[jobs] {hint}")
        return contextlib.nullcontext(mps_mod.MpsState())

    @contextlib.contextmanager
    def recorded():
        with mps_mod.mps_session(per_gpu, lambda line: session.say(line)) as state:
            session.mps_status = state.status
            if session.header is not None:  # written before the daemon was settled
                session.header.setdefault("settings", {})["mps"] = state.status
            yield state
    return recorded()
