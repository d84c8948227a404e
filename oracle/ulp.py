"""Units in the last place of bf16 and fp16, the unit every output tolerance is written in.

`ulp_bf16(x) = 2 ** (floor(log2 |x|) - 7)` for normal `x` (8 bits of significand, 7 stored);
`ulp_fp16(x) = 2 ** (floor(log2 |x|) - 10)`. Below the smallest normal the spacing is constant.
"""

from __future__ import annotations

import math

_MANTISSA_BITS = {"bfloat16": 7, "float16": 10}
_MIN_NORMAL_EXP = {"bfloat16": -126, "float16": -14}


def ulp(x: float, dtype: str = "bfloat16") -> float:
    """Spacing of `dtype` numbers at magnitude `|x|` (a float, never 0: at 0 it is the subnormal step)."""
    if dtype not in _MANTISSA_BITS:
        raise ValueError(f"dtype: one of {sorted(_MANTISSA_BITS)}, got {dtype!r}")
    bits = _MANTISSA_BITS[dtype]
    ax = abs(float(x))
    if not math.isfinite(ax):
        return math.inf
    # floor(log2 |x|) exactly: math.log2 rounds up to the integer just below a power of two (e.g. 8 - 2**-50).
    exp = _MIN_NORMAL_EXP[dtype] if ax == 0 else max(math.frexp(ax)[1] - 1, _MIN_NORMAL_EXP[dtype])
    return 2.0 ** (exp - bits)


def ulp_bf16(x: float) -> float:
    return ulp(x, "bfloat16")


def ulp_fp16(x: float) -> float:
    return ulp(x, "float16")
