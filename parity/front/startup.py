"""The start-up of both front ends (`dflash-parity` and the pytest plugin): what a verb that runs cases sets up first.

`start(jobs=1, jobs_start="prefork")`, in this order:
- the bytecode cache where `DFLASH_PARITY_PYCACHE=DIR` asks for one (`pycache_where_asked`: Python's own
  `PYTHONPYCACHEPREFIX`, for this process and those it starts; for an image whose torch has no bytecode and may
  write none);
- one compile of each Triton kernel across the run's processes (`parity.exec.shared_compiles.share_compiles`,
  inherited by every process started after it);
- with `jobs > 1` and `jobs_start == "prefork"`: the prefork the `--jobs` children are forked from launched now
  (`parity.exec.prefork.start_early`, importing `parity.front.part.CHILD_PRELOAD`), so its imports overlap this
  process's own (the command line's parsing imports torch);
- the ports (`install_ports`: `parity.exec.ports_impl.install`, the hook watchdog among them).
It returns a `Started`, whose `close()` stops a prefork launched early that no run adopted.

Who calls it: `dflash-parity check`, `repro` and `bench` (`parity.front.cli.main`, before the command line is parsed),
the pytest plugin once a session uses it (`parity.front.pytest_plugin`), nothing else. `dflash-parity list` installs
the ports alone (its `available()` calls are bounded as `check`'s are); `gate` and `merge` start nothing. A `--jobs`
child (`parity.front.child`) installs the ports: what the rest sets up it inherits from its parent.

Public: `start`, `Started`, `install_ports`, `pycache_where_asked`, `PYCACHE_ENV`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import MutableMapping

from parity.exec import pool, prefork, shared_compiles
from parity.front.part import CHILD_PRELOAD

PYCACHE_ENV = "DFLASH_PARITY_PYCACHE"


class Started:
    """What `start` set up that must end with the command: a prefork launched early that no run adopted."""

    def __init__(self, launched_prefork: bool) -> None:
        self.launched_prefork = launched_prefork

    def close(self) -> None:
        if self.launched_prefork:
            prefork.discard_early()


def pycache_where_asked(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Where `DFLASH_PARITY_PYCACHE` names a folder (not `off`) and the user set no `PYTHONPYCACHEPREFIX`: Python's
    bytecode cache pointed there, for this process (`sys.pycache_prefix`) and those it starts
    (`PYTHONPYCACHEPREFIX`), bytecode written even where `PYTHONDONTWRITEBYTECODE` forbade it (naming the folder is
    the opt-in); the folder, or None where nothing changed. Modules imported before keep the bytecode they had."""
    env = os.environ if environ is None else environ
    chosen = env.get(PYCACHE_ENV, "")
    if not chosen or chosen == "off" or env.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix:
        return None
    where = Path(chosen).expanduser()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(where, os.W_OK):
        return None
    sys.pycache_prefix = env["PYTHONPYCACHEPREFIX"] = str(where)
    sys.dont_write_bytecode = False
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return where


def install_ports() -> None:
    """Every port of the engine and the strategies gets the process machinery's implementation
    (`parity.exec.ports_impl.install`: the hook watchdog, ...)."""
    from parity.exec import ports_impl  # here, not at import: it imports torch, which `start` launches the prefork
    #                                     before (and `dflash-parity gate` never imports)

    ports_impl.install()


def start(jobs: int = 1, jobs_start: str = "prefork") -> Started:
    """The start-up (see the module docstring); call it before torch is imported where possible."""
    pycache_where_asked()
    shared_compiles.share_compiles()  # before any process is started: they inherit it
    launched = False
    if jobs > 1 and jobs_start == "prefork":
        launched = prefork.start_early(pool.child_env(jobs), CHILD_PRELOAD) is not None
    install_ports()
    return Started(launched)
