"""How every report file is written: atomically (a temporary file beside it, renamed into place), so a
crash never leaves half a file; JSON in the reports' one layout (`dumps`).

Public: `atomic_write`, `dumps`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, text: str) -> None:
    """`text` as the whole content of `path` (its directory created), or the file as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dumps(data: Any, indent: int = 2, _level: int = 0) -> str:
    """JSON like `json.dumps(data, indent=2)`, but a list of numbers or strings stays on one line: a
    case's context lengths and page table read as one row each (a 200-case report is 2.1 MB and
    tens of thousands of lines otherwise)."""
    pad, inner = " " * (indent * _level), " " * (indent * (_level + 1))
    if isinstance(data, dict):
        if not data:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, indent, _level + 1)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(data, (list, tuple)):
        if all(not isinstance(x, (dict, list, tuple)) for x in data):
            return json.dumps(list(data))
        return "[\n" + ",\n".join(inner + dumps(x, indent, _level + 1) for x in data) + "\n" + pad + "]"
    return json.dumps(data)
