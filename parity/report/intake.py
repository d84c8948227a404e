"""What a user hands over, refused before anything is allocated: files by kind, size and nesting, and a
case by the memory it would need. Each refusal is one `InvalidInput` naming the file (and the field).

- `read_json(path, what)`: a regular file only (a FIFO, a device such as a link to `/dev/zero`, a
  directory or a socket is refused by kind, without blocking: it is opened non-blocking and checked with
  `fstat` before a byte is read), at most `max_bytes`, valid JSON no deeper than the parser's stack.
- `read_case_file(path)`: a case file or a failure file (`{"lowering", "case", ...}`) -> (case, wrapper).
- `case_bytes(case)` and `check_case_fits(case, device, source)`: the memory a case needs in `check`
  (its tensors, their snapshot and re-run copies, the oracle's fp32 working set) against
  `MAX_CASE_BYTES` and the memory of the device it would run on (total GPU memory on CUDA, physical
  memory on a CPU).

Public: `read_json`, `read_case_file`, `case_bytes`, `check_case_fits`, `MAX_JSON_BYTES`, `MAX_CASE_BYTES`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from oracle.case import Case
from oracle.errors import InvalidInput

MAX_JSON_BYTES = 256 << 20  # a 200-case parity.json is ~2 MB; a case file with B = 65536 is ~10 MB
MAX_CASE_BYTES = 256 << 30  # past any device's memory today; the device's own size is checked too
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_json(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file `path`; `InvalidInput(str(path), ...)` for a missing file, a file
    of another kind, one past `max_bytes`, one that is not JSON or is nested too deeply. `what` names
    the file's role in the 'not found' message (`case file`, `report`)."""
    where = str(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidInput(where, f"{what} not found") from None
    except OSError as err:
        raise InvalidInput(where, f"cannot open the {what}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(where, f"is {_kind(st.st_mode)}, not a regular {what}; refused without reading it")
        if st.st_size > max_bytes:
            raise InvalidInput(where, f"{st.st_size} bytes, more than the {max_bytes} a {what} may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(max_bytes + 1)
    except OSError as err:
        raise InvalidInput(where, f"cannot read the {what}: {err.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise InvalidInput(where, f"more than the {max_bytes} bytes a {what} may have")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InvalidInput(where, f"not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise InvalidInput(where, f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise InvalidInput(where, "JSON nested too deeply") from None


def read_case_file(path: str | Path) -> tuple[Case, dict[str, Any]]:
    """A case file (a case's JSON object) or a failure file (`{"lowering", "case", ...}`): the case and the
    wrapper (`{}` for a bare case). Type, size and nesting are checked before the case is built."""
    data = read_json(path, "case file")
    where = str(path)
    if isinstance(data, dict) and "case" in data:
        if not isinstance(data["case"], dict):
            raise InvalidInput(f"{where}: case", f"a JSON object (the case), got {type(data['case']).__name__}")
        for key in ("lowering", "device"):
            if key in data and not isinstance(data[key], str):
                raise InvalidInput(f"{where}: {key}", f"a string, got {type(data[key]).__name__}")
        return Case.from_json_dict(data["case"], source=where), data
    return Case.from_json_dict(data, source=where), {}


ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
ORACLE_CHUNK = 2048  # keys per step of the torch oracle (oracle.reference)


def case_bytes(case: Case) -> int:
    """Bytes `check` needs for one case, an upper estimate: the inputs (pool, queries, block, page table,
    output) three times (the lowering's, the untouched-input snapshot, the re-run with the other canary)
    and the oracle's fp32 working set (per request: a chunk of keys and values, and its scores)."""
    e, kv = ELEMENT_BYTES[case.dtype], ELEMENT_BYTES[case.kv_dtype]
    B, K, Hq, Hkv, D = case.batch_size, case.block_size, case.num_q_heads, case.num_kv_heads, case.head_dim
    pool = 2 * case.num_pages * case.page_size * Hkv * D * kv
    small = B * K * (2 * Hq * D * e + 2 * Hkv * D * e + 4 * Hq)
    table = B * (case.max_pages_per_request + case.page_table_pad) * 8
    chunk = min(ORACLE_CHUNK, case.max_keys)
    oracle = 8 * chunk * Hkv * D * 4 + 4 * K * Hq * chunk * 4 + B * K * Hq * (D + 1) * 4
    return 3 * (pool + small + table) + oracle


def _device_bytes(device: str) -> tuple[int | None, str]:
    """(bytes, what) of the memory a case competes for on `device`; None when unknown."""
    if device == "cuda":
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory), "GPU memory"
        return None, ""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    except (ValueError, OSError, AttributeError):
        return None, ""


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def check_case_fits(case: Case, device: str, source: str) -> None:
    """`InvalidInput("SOURCE: num_pages", ...)` (or `batch_size`, whichever term dominates) when the case
    needs more than `MAX_CASE_BYTES` or than the device's memory."""
    need = case_bytes(case)
    have, what = _device_bytes(device)
    limit, limit_what = MAX_CASE_BYTES, "the limit on one case"
    if have is not None and have < limit:
        limit, limit_what = have, f"the {what} of this {device} machine"
    if need <= limit:
        return
    pool = 3 * 2 * case.num_pages * case.page_size * case.num_kv_heads * case.head_dim * ELEMENT_BYTES[case.kv_dtype]
    field = "num_pages" if 2 * pool >= need else "batch_size"  # the pool's pages, or the batch's rows
    raise InvalidInput(f"{source}: {field}", f"this case needs about {_gib(need)} to check (num_pages "
                                            f"{case.num_pages} x page_size {case.page_size}, batch {case.batch_size}, "
                                            f"block {case.block_size}, heads {case.num_q_heads}/{case.num_kv_heads}, "
                                            f"head_dim {case.head_dim}), more than {_gib(limit)}, {limit_what}; "
                                            f"refused before allocating")
