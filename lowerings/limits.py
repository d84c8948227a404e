"""What a lowering may be given: `Limits`, the bounds on the cases drawn for it (its `case_limits(device)` hook
returns one, or None for the device's defaults), and the `--limit FIELD=VALUE` overrides of them.

The strategies (`strategies.cases`, `strategies.limits_for`) draw under a `Limits`; it lives here, below them, so that
a lowering can say what it takes without importing the layer that draws. `strategies.Limits` is this class.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lowerings.models import MODEL_NAMES
from oracle.case import VALUE_REGIMES

HEAD_DIMS = (64, 128)
LIMIT_DTYPES = ("bfloat16", "float16")
LIMIT_KV_DTYPES = ("same", "bfloat16", "float16", "float8_e4m3fn")


@dataclass(frozen=True)
class Limits:
    """Bounds on the drawn shapes (a lowering may shrink them per device: interpreted Triton is slow). The
    `max_*`/`models` fields after `values` bound the production dimension (the model rows of `lowerings.models`);
    left None, `strategies.limits_for` sets them for the device (CUDA: contexts to 131072, every model
    row; CPU: off)."""

    max_batch: int = 33
    max_context: int = 300
    max_kv_heads: int = 3
    max_group: int = 8
    max_block: int = 16
    head_dims: tuple[int, ...] = HEAD_DIMS
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    kv_dtypes: tuple[str, ...] = ("same", "float8_e4m3fn")  # "same": the working dtype
    values: tuple[str, ...] = VALUE_REGIMES  # value regimes (oracle/values.py)
    # The production dimension; None: the device's default (`strategies.limits_for`).
    max_production_context: int | None = None  # the long requests' longest context; 0: no production draws
    max_production_batch: int | None = None
    models: tuple[str, ...] | None = None  # rows of lowerings.models drawn; (): the small shapes' heads
    max_case_bytes: int | None = None  # oracle.footprint.run_bytes of a production draw stays under it
    max_pool_elements: int | None = None  # pools padded past 2**31 (2**32) elements when above it; 0: never

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_kv_heads", "max_group", "max_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Limits.{name}: a positive integer, got {v!r}")
        if not isinstance(self.max_context, int) or self.max_context < 0:
            raise ValueError(f"Limits.max_context: an integer >= 0, got {self.max_context!r}")
        for name, allowed in (("dtypes", LIMIT_DTYPES), ("kv_dtypes", LIMIT_KV_DTYPES), ("values", VALUE_REGIMES)):
            v = getattr(self, name)
            if not v or any(x not in allowed for x in v):
                raise ValueError(f"Limits.{name}: one or more of {', '.join(allowed)}, got {v!r}")
        if not self.head_dims or any(not isinstance(d, int) or d < 1 for d in self.head_dims):
            raise ValueError(f"Limits.head_dims: one or more positive integers, got {self.head_dims!r}")
        _validate_production(self)


def _validate_production(lim: "Limits") -> None:
    for name, least in (("max_production_context", 0), ("max_production_batch", 1), ("max_case_bytes", 1),
                        ("max_pool_elements", 0)):
        v = getattr(lim, name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
            raise ValueError(f"Limits.{name}: None (the device's default) or an integer >= {least}, got {v!r}")
    if lim.models is not None and (not isinstance(lim.models, tuple) or any(m not in MODEL_NAMES for m in lim.models)):
        raise ValueError(f"Limits.models: None (the device's default) or rows of lowerings.models "
                         f"({', '.join(MODEL_NAMES)}), got {lim.models!r}")


def limit_overrides(texts) -> dict[str, Any]:
    """`FIELD=VALUE[,VALUE...]` texts (the CLI's `--limit`, repeatable) -> `Limits` field overrides for
    `dataclasses.replace`, e.g. `dtypes=float16,bfloat16`, `head_dims=64`, `max_context=4096`,
    `max_production_context=16384`, `models=llama-3.1-8b-dflash` (`models=none`: no model rows). A bad one
    raises ValueError naming `--limit` and what is expected."""
    fields = {f.name: f.type for f in dataclasses.fields(Limits)}
    out: dict[str, Any] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--limit: expected FIELD=VALUE with FIELD one of {', '.join(fields)}, got {text!r}")
        parts = [x.strip() for x in value.split(",") if x.strip()]
        if not parts:
            raise ValueError(f"--limit {name}: no value given")
        if name.startswith("max_"):
            if len(parts) != 1 or not parts[0].isdigit():
                raise ValueError(f"--limit {name}: one non-negative integer, got {value!r}")
            out[name] = int(parts[0])
        elif name == "models":
            out[name] = () if parts == ["none"] else tuple(parts)
        elif name == "head_dims":
            if not all(x.isdigit() for x in parts):
                raise ValueError(f"--limit head_dims: positive integers separated by commas, got {value!r}")
            out[name] = tuple(int(x) for x in parts)
        else:
            out[name] = tuple(parts)
    try:
        dataclasses.replace(Limits(), **out)  # every value checked now, where the option is named
    except ValueError as err:
        raise ValueError(f"--limit: {err}") from None
    return out


def with_overrides(limits: "Limits | None", overrides: dict[str, Any]) -> "Limits | None":
    """`limits` (None: the defaults) with `limit_overrides`'s fields replaced; None if none given."""
    if not overrides:
        return limits
    return dataclasses.replace(limits or Limits(), **overrides)
