"""What a check drew, per lowering: histograms of the cases' context lengths, dtypes, KV dtypes, head
dims, and how many pools passed 2**31 elements. `parity.json` keeps them under each lowering's `drawn`;
`summary.md` shows them as one table, so a run says whether it reached production scale.

    "drawn": {"context": {BUCKET: n}, "dtype": {...}, "kv_dtype": {...}, "head_dim": {"64": n, ...},
              "pools_past_2^31": n}

A case counts once, at its longest context `max_b L_b`, in the buckets `CONTEXT_BUCKETS`.
"""

from __future__ import annotations

from typing import Any

from oracle.case import Case
from parity.escape import md_code, md_text

CONTEXT_BUCKETS = ((0, 0), (1, 127), (128, 2047), (2048, 4096), (4097, 32768), (32769, 131072))
LONG = 4096  # "long" in the summary: a context past this many keys
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}
POOL_KEY = "pools_past_2^31"


def bucket(L: int) -> str:
    for lo, hi in CONTEXT_BUCKETS:
        if lo <= L <= hi:
            return str(lo) if lo == hi else f"{lo}-{hi}"
    return f">{CONTEXT_BUCKETS[-1][1]}"


def new() -> dict[str, Any]:
    return {"context": {}, "dtype": {}, "kv_dtype": {}, "head_dim": {}, POOL_KEY: 0}


def add(drawn: dict[str, Any], case: Case) -> None:
    """Count `case` into `drawn` (in place)."""
    for key, value in (("context", bucket(max(case.context_lens))), ("dtype", SHORT.get(case.dtype, case.dtype)),
                       ("kv_dtype", SHORT.get(case.kv_dtype, case.kv_dtype)), ("head_dim", str(case.head_dim))):
        drawn[key][value] = drawn[key].get(value, 0) + 1
    if case.num_pages * case.page_size * case.num_kv_heads * case.head_dim > 2**31:
        drawn[POOL_KEY] += 1


def merge(entries: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The sum of several `drawn` histograms (shards of one lowering); missing ones count as empty."""
    out = new()
    for d in entries:
        for key, counts in (d or {}).items():
            if key == POOL_KEY:
                out[POOL_KEY] += int(counts)
                continue
            for value, n in counts.items():
                out.setdefault(key, {})[value] = out.setdefault(key, {}).get(value, 0) + int(n)
    return out


def long_share(drawn: dict[str, Any]) -> tuple[int, int]:
    """`(cases with a context past LONG keys, cases)`."""
    ctx = drawn.get("context", {})
    total = sum(ctx.values())
    long = sum(n for b, n in ctx.items() if b.startswith(">") or int(b.split("-")[0]) > LONG)
    return long, total


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "-"


def summary_lines(lowerings: dict[str, dict[str, Any]]) -> list[str]:
    """The Markdown table of what each lowering drew ([] when no entry has a histogram)."""
    rows = [(name, v["drawn"]) for name, v in lowerings.items() if v.get("drawn") and v["drawn"].get("context")]
    if not rows:
        return []
    heads = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in CONTEXT_BUCKETS]
    out = ["", "## Drawn cases", "",
           f"Longest context per case (keys), share past {LONG}, dtypes, KV dtypes, head dims, pools past 2^31 elements.",
           "", "| lowering | " + " | ".join(heads) + f" | >{LONG} | dtype | KV dtype | head dim | pools >2^31 |",
           "|---|" + "---|" * (len(heads) + 5)]
    for name, d in rows:
        ctx = d["context"]
        long, total = long_share(d)

        def mix(key: str) -> str:
            counts = d.get(key, {})
            return ", ".join(f"{md_text(k, table=True)} {_pct(n, total)}"
                             for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))

        out.append(f"| {md_code(name, table=True)} | " + " | ".join(md_text(ctx.get(h, 0), table=True) for h in heads)
                   + f" | {_pct(long, total)} | {mix('dtype')} | {mix('kv_dtype')} | {mix('head_dim')} | "
                   f"{md_text(d.get(POOL_KEY, 0), table=True)} |")
    return out
