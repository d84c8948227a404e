"""Semantic rules the production lowerings and the strategies share, each defined once (docs/semantics.md section 4).

- `LN2`, `LOG2E`: the LSE base conversions (`log2 x = ln x / ln 2`; flashinfer and trtllm-gen return
  base-2 LSEs, torch and flash-attn natural ones).
- `DECODE_ROWS_MAX_BATCH`: seed 002's dispatch threshold: decode rows when `B <= 32`, the context form
  (one paged prefill) above it.
- `context_window_reason(case)`: when one context-FMHA call (an end-aligned left window only) cannot
  express the case's window exactly.
- `decode_rows_window_reason(case)`: when decode rows (every row ends at `L+K`) cannot.
"""

from __future__ import annotations

import math

from oracle.case import Case

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
DECODE_ROWS_MAX_BATCH = 32  # seed 002's dispatch threshold


def context_window_reason(case: Case) -> str | None:
    """None when context FMHA (`K` queries over `L+K` keys, `causal=False`, `window_left = left`) computes
    `case` exactly: it expresses only an end-aligned left window, exact iff `K-1 <= right` (i.e. `K <= W`)."""
    right = case.window[1]
    if right != -1 and case.block_size - 1 > right:
        return (f"context FMHA expresses only an end-aligned left window; exact iff K-1 <= right, "
                f"got K={case.block_size}, window={case.window}")
    return None


def decode_rows_window_reason(case: Case) -> str | None:
    """None when decode rows (`B*K` single-query rows, each over `L+K` keys) compute `case` exactly:
    non-causal unwindowed layers only."""
    if case.window != (-1, -1):
        return f"decode rows all end at L+K: exact for non-causal unwindowed layers only, got window={case.window}"
    return None
