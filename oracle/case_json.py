"""A case read from JSON (a user's file, a failure file, a worker's answer): the JSON types and sizes of its fields,
checked before the `Case` is built (`oracle.case.Case.from_json_dict`), so that a bad file is refused with the file
and the field named, and a huge one before anything is allocated."""

from __future__ import annotations

from typing import Any

from oracle.errors import InvalidInput


def is_int(x: Any) -> bool:
    """An integer, not a bool (JSON's `true` reads as a Python bool, an int subclass)."""
    return isinstance(x, int) and not isinstance(x, bool)


# The largest values a case read from JSON may hold: past them it is refused before anything is built
# (B = 10**6 or K = 10**5 would hang the run or get it OOM-killed). The bytes a case needs are checked
# against the device's memory where it runs (parity.front.intake.check_case_fits).
JSON_BOUNDS = {"batch_size": 1 << 16, "block_size": 1 << 12, "num_q_heads": 1 << 10, "num_kv_heads": 1 << 10,
               "head_dim": 1 << 10, "page_size": 1 << 16, "num_pages": 1 << 24, "context_lens": 1 << 24,
               "page_table_pad": 1 << 16}
_JSON_INTS = ("block_size", "num_q_heads", "num_kv_heads", "head_dim", "page_size", "num_pages", "page_table_pad",
              "seed")
_JSON_STRS = ("layout", "dtype", "kv_dtype", "block_storage", "page_table_dtype")


def shown(x: Any) -> str:
    """A JSON value as a message shows it: scalars as they are (cut), arrays and objects by kind and size
    (never recursing into them: a deeply nested value must not blow the stack)."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (list, tuple)):
        return f"an array of {len(x)}"
    if isinstance(x, dict):
        return f"an object of {len(x)} key(s)"
    text = repr(x)
    kind = "a string " if isinstance(x, str) else ""
    return kind + (text if len(text) <= 40 else text[:37] + "...")


def check_json_fields(data: dict[str, Any], source: str) -> None:
    """JSON types and sizes of a case's fields, before the `Case` is built: one InvalidInput naming the
    file and the field (`FILE: pages: an array of arrays of page ids, got 3`)."""
    def bad(where: str, rule: str) -> None:
        raise InvalidInput(f"{source}: {where}", rule)

    for name in _JSON_INTS:
        if name in data and not is_int(data[name]):
            bad(name, f"an integer, got {shown(data[name])}")
    for name in _JSON_STRS:
        if name in data and not isinstance(data[name], str):
            bad(name, f"a string, got {shown(data[name])}")
    for name in ("k_scale", "v_scale", "scale"):
        v = data.get(name, 1.0)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool)) and not (name == "scale" and v is None):
            bad(name, f"a number{' or null' if name == 'scale' else ''}, got {shown(v)}")
    lens, pages, window = data["context_lens"], data["pages"], data.get("window", [-1, -1])
    if isinstance(lens, list) and len(lens) > JSON_BOUNDS["batch_size"]:  # before walking a million entries
        bad("batch_size", f"batch_size at most {JSON_BOUNDS['batch_size']} in a case read from JSON (refused "
                          f"before anything is allocated), got {len(lens)}")
    if not isinstance(lens, list) or not all(is_int(x) for x in lens):
        bad("context_lens", f"an array of integers, got {shown(lens)}"
            + ("" if not isinstance(lens, list) else f" holding {shown(next(x for x in lens if not is_int(x)))}"))
    if not isinstance(pages, list) or not all(isinstance(r, list) for r in pages):
        bad("pages", f"an array of arrays of page ids (one per request), got {shown(pages)}"
            + ("" if not isinstance(pages, list) else f" holding {shown(next(r for r in pages if not isinstance(r, list)))}"))
    for b, row in enumerate(pages):
        if not set(map(type, row)) <= {int}:  # JSON integers (bool is not int here); one C-level pass per row
            bad(f"pages[{b}]", f"an array of integer page ids, holding {shown(next(p for p in row if not is_int(p)))}")
    for name in ("value_keys", "peak_keys"):
        if name in data and not (isinstance(data[name], list) and all(is_int(x) for x in data[name])):
            bad(name, f"an array of integers (one per request), got {shown(data[name])}")
    if not isinstance(window, list) or len(window) != 2 or not all(is_int(w) for w in window):
        bad("window", f"an array [left, right] of two integers, got {shown(window)}")
    sizes = {"batch_size": len(lens), "context_lens": max(lens, default=0),
             **{k: data[k] for k in JSON_BOUNDS if k in data and k != "context_lens"}}
    for name, v in sizes.items():
        if v > JSON_BOUNDS[name]:
            what = "each context length" if name == "context_lens" else name
            bad(name, f"{what} at most {JSON_BOUNDS[name]} in a case read from JSON (refused before anything is "
                      f"allocated), got {v}")
    listed = sum(len(r) for r in pages)
    if listed > JSON_BOUNDS["num_pages"]:
        bad("pages", f"at most {JSON_BOUNDS['num_pages']} page ids in all, got {listed}")
