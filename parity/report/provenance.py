"""What a `check` run checked, recorded in `parity.json` so that the merge gate compares like with like.

`run_header(...)` is the report's top level before its lowerings: a `run_id` and the `started` time
(ISO-8601, UTC, microseconds), the device, the settings that decide which cases were drawn and how hard
each was checked (profile, seed, max_examples, hardening, isolation, `--limit`s, ...), the effective
policy (every bound applied per lowering and dtype, with its source table and reason: `Policy.record`),
the plugin files with their content hashes, and the git commit of the checkout (best effort).
`finish(data, interrupted)` stamps `finished` and the run's `verdict` (`verdict_of`). `parse_shard(text)`
reads the `shard` setting ("I/S": `check --shard I/S`) back, from the command line or from a report.

Public: `new_run_id`, `now`, `parse_time`, `parse_shard`, `file_sha256`, `git_commit`, `run_settings`,
`run_header`, `verdict_of`, `finish`, `VERDICTS`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import subprocess
import uuid
from pathlib import Path
from typing import Any, Sequence

from parity.engine import ranges

VERDICTS = ("pass", "fail", "interrupted", "nothing judged")


def new_run_id() -> str:
    return uuid.uuid4().hex


def now() -> str:
    """The current UTC time, ISO-8601 with microseconds (a run started within the second of a
    `--not-before $(date -Is)` still counts as after it)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def parse_time(text: str, where: str) -> _dt.datetime:
    """An ISO-8601 time (`2026-12-01T10:00:00Z`, `...+02:00`; no zone: UTC) or a Unix time in seconds
    (`@1764583200` or `1764583200`), as an aware datetime; InvalidInput naming `where` otherwise."""
    from oracle.errors import InvalidInput

    t = str(text).strip()
    try:
        if t.lstrip("@").replace(".", "", 1).isdigit():
            return _dt.datetime.fromtimestamp(float(t.lstrip("@")), _dt.timezone.utc)
        d = _dt.datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except (ValueError, OverflowError, OSError):
        raise InvalidInput(where, f"an ISO-8601 time (2026-12-01T10:00:00Z) or a Unix time (@1764583200), got {text!r}") from None
    return d if d.tzinfo is not None else d.replace(tzinfo=_dt.timezone.utc)


def parse_shard(text: str, where: str = "--shard") -> tuple[int, int]:
    """`I/S` (0 <= I < S <= `parity.engine.ranges.MAX_RUN_SHARDS`, both integers) -> (I, S); InvalidInput naming
    `where` otherwise (before anything is sized by S)."""
    from oracle.errors import InvalidInput  # late: `oracle` imports torch, and the pytest plugin reads `--shard`

    i, sep, n = str(text).partition("/")
    try:
        shard = (int(i), int(n)) if sep and len(str(text)) <= 64 else (-1, 0)
    except ValueError:
        shard = (-1, 0)
    if not 0 <= shard[0] < shard[1]:
        raise InvalidInput(where, f"expected I/S with 0 <= I < S (shard I of S, counted from 0), got {text!r}")
    if shard[1] > ranges.MAX_RUN_SHARDS:
        raise InvalidInput(where, f"S at most {ranges.MAX_RUN_SHARDS} shards (a run split over more machines than "
                                  f"that is refused before anything is sized by it), got {str(text)[:64]!r}")
    return shard


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes ('' when it cannot be read)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def git_commit(cwd: str | Path = ".") -> dict[str, Any] | None:
    """`{"commit": sha, "dirty": bool}` of the git checkout at `cwd`, or None (no git, not a checkout)."""
    def git(*argv: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(cwd), *argv], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": bool(status) if status is not None else None}


def run_settings(config: Any, *, device: str, settings: Any, lowerings: Sequence[str], **extra: Any) -> dict[str, Any]:
    """The settings of a check (`parity.front.config.CheckConfig`) that decide which cases are drawn and how hard
    each is checked; `shard` ("I/S") and `flaky_runs` only when set; `extra` entries added (`jobs`: the
    processes of a pytest-xdist run)."""
    out = {
        "lowerings": list(lowerings), "device": device, "device_name": _device_name(device),
        "profile": config.profile, "seed": config.seed, "derandomized": bool(getattr(settings, "derandomize", False)),
        "max_examples": int(settings.max_examples), "hardening": bool(config.hardening),
        "isolation": bool(config.isolate), "case_timeout": config.case_timeout,
        "kernel_names_every": config.kernel_names_every, "limits": list(config.limits),
        "jobs": config.jobs, "shards": list(config.shards), "warm_up": bool(config.warm_up),
        "allow_loose_bounds": bool(config.allow_loose_bounds),
        "allow_nothing_judged": bool(config.allow_nothing_judged),
    }
    if config.shard is not None:
        out["shard"] = f"{config.shard[0]}/{config.shard[1]}"
    if config.flaky_runs is not None:
        out["flaky_runs"] = config.flaky_runs
    out.update(extra)
    return out


def _device_name(device: str) -> str:
    try:
        import torch

        if device == "cuda" and torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:  # best effort: a name is a label, never a reason to fail
        pass
    import platform

    return platform.processor() or platform.machine()


def run_header(*, run_id: str, started: str, device: str, profile: str, policy: Any, lowerings: Sequence[str],
               settings: dict[str, Any], plugins: Sequence[str]) -> dict[str, Any]:
    """The top level of `parity.json` for this run (see the module docstring); `lowerings` is filled later."""
    import torch

    return {"run_id": run_id, "started": started, "device": device, "profile": profile, "torch": torch.__version__,
            "tolerances": policy.source, "git": git_commit(), "settings": settings,
            "plugins": [{"path": str(Path(p).resolve()), "sha256": file_sha256(p)} for p in plugins],
            "policy": policy.record(list(lowerings))}


def verdict_of(data: dict[str, Any], interrupted: bool) -> str:
    """`interrupted`, `fail` (a lowering failed), `nothing judged` (no case of any lowering was judged:
    every one unavailable or every case unsupported), else `pass`."""
    lows = data.get("lowerings", {})
    if interrupted:
        return "interrupted"
    if any(v.get("status") == "fail" for v in lows.values()):
        return "fail"
    if sum(judged(v) for v in lows.values()) == 0:
        return "nothing judged"
    return "pass"


def judged(entry: dict[str, Any]) -> int:
    """Cases a lowering's entry judged (drawn, minus those its `supports()` declined)."""
    return int(entry.get("cases", 0)) - int(entry.get("unsupported", 0))


def finish(data: dict[str, Any], *, interrupted: bool) -> dict[str, Any]:
    """`data` stamped with `finished` (also `created`) and its `verdict`."""
    data["finished"] = data["created"] = now()
    data["verdict"] = verdict_of(data, interrupted)
    return data
