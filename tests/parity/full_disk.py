"""A stand-in for a full file system under one directory, in this process: every write of data below
`root` raises `OSError(ENOSPC)`, as a full disk does.

What a full ext4 or xfs file system still allows is allowed: opening and creating an empty file (an
inode, no data block), renaming, unlinking, `flock`. What needs a data block raises ENOSPC: `os.write`,
`os.pwrite`, a file object's write or flush (`open`, `io.open`, `os.fdopen`, `Path.write_text`) and
`os.mkdir` (a new directory needs a block for its entries).

Use: `with full_disk(tmp_path / "r"): cli.main([...])`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
from pathlib import Path
from typing import Any, Iterator


def _enospc(what: Any) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(what))


class _FullFile:
    """A file opened for writing below the full directory: every write raises ENOSPC."""

    def __init__(self, real: Any, name: str) -> None:
        self._real, self.name = real, name

    def write(self, data: Any) -> int:
        if data:
            raise _enospc(self.name)
        return 0

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._real.close()

    def fileno(self) -> int:
        return self._real.fileno()

    def __enter__(self) -> "_FullFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def full_disk(root: str | Path) -> Iterator[None]:
    """Inside the block, writes of data below `root` raise ENOSPC (see the module docstring)."""
    root_s = str(Path(root).resolve())
    under = lambda p: str(p) == root_s or str(p).startswith(root_s + os.sep)  # noqa: E731

    def fd_path(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def resolved(path: Any) -> str:
        try:
            return str(Path(os.fsdecode(path)).resolve())
        except (TypeError, ValueError, OSError):
            return ""

    real_write, real_pwrite, real_mkdir = os.write, os.pwrite, os.mkdir
    real_fdopen, real_open = os.fdopen, io.open

    def write(fd, data):
        if data and under(fd_path(fd)):
            raise _enospc(fd_path(fd))
        return real_write(fd, data)

    def pwrite(fd, data, offset):
        if data and under(fd_path(fd)):
            raise _enospc(fd_path(fd))
        return real_pwrite(fd, data, offset)

    def mkdir(path, *a, **k):
        if under(resolved(path)) and not os.path.exists(path):
            raise _enospc(path)
        return real_mkdir(path, *a, **k)

    def writing(mode: str) -> bool:
        return any(c in mode for c in "wax+")

    def fdopen(fd, mode="r", *a, **k):
        f = real_fdopen(fd, mode, *a, **k)
        return _FullFile(f, fd_path(fd)) if writing(mode) and under(fd_path(fd)) else f

    def open_(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        if not writing(mode):
            return f
        name = fd_path(file) if isinstance(file, int) else resolved(file)
        return _FullFile(f, name) if under(name) else f

    saved = (os.write, os.pwrite, os.mkdir, os.fdopen, io.open, builtins.open)
    os.write, os.pwrite, os.mkdir, os.fdopen, io.open, builtins.open = write, pwrite, mkdir, fdopen, open_, open_
    try:
        yield
    finally:
        os.write, os.pwrite, os.mkdir, os.fdopen, io.open, builtins.open = saved
