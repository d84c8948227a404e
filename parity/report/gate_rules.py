"""The rules of `dflash-parity gate` (`RULES`, each accepted only by name) and the run-level ones, each a small
pure function of the two reports' data that returns the `Problem`s it finds, in the manner of
`torch.testing._comparison`'s message builders: one function per kind of difference, its message built
where the difference is found. `parity.report.gate` calls them in a fixed order (then each lowering's,
`parity.report.gate_lowerings`) and writes the verdict.

- the new run itself: `verdict_problems` (a baseline that did not pass; a new run interrupted, judging
  nothing, or not passing), `identity_problems` (`--not-before`, `--commit`), `shard_problems` (one
  shard's report on either side);
- the settings: `settings_problems` (hardening, isolation, device, profile, seed, `--limit`),
  `gate_setting_problems` (`[gate] max_margin_growth` changed by the policy under review);
- the policy: `kernel_entry_problems` (the `[kernel."<key>".<dtype>]` entries) and, for one lowering's
  recorded bounds, `bound_problems` (looser than the baseline's, past the sanity ceiling, an override
  without a reason); `base_defaults` (the baseline's bounds from its defaults, what a new lowering or a new
  kernel entry is compared with).

Public: `RULES`, `Problem`, the functions above.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

from parity.engine.policy import CEILINGS, OPTIONAL_KEYS, Ceiling
from parity.report.escape import md_code as _c, md_text as _t  # report text in gate.md: inert
from parity.report.provenance import parse_time

RULES: dict[str, str] = {
    "baseline-failed": "the baseline's own verdict is not a pass (a lowering failed, the run was interrupted, or "
                       "it judged nothing): a comparison against it hides regressions",
    "lowering-removed": "a lowering of the baseline is missing from the new report, or no longer available in it",
    "class-removed": "a case class (dtype/kv_dtype/kind/layout/storage) the baseline judged has no case now",
    "fewer-cases": "a lowering judged fewer cases than in the baseline (exactly, for reproducible draws; beyond "
                   "5 sigma for random ones)",
    "nothing-judged": "a lowering (or the whole run) judged no case: every case unsupported",
    "hardening-off": "the new run checked with less hardening (--no-hardening, or kernel names profiled less often)",
    "isolation-off": "the new run ran its cases in process (--no-isolate) where the baseline isolated them",
    "settings-changed": "device, profile, seed or --limit differ from the baseline's: not like with like",
    "looser-bounds": "a bound applied to a lowering is larger than the baseline's (a new lowering: than the "
                     "baseline's defaults)",
    "loose-bounds": "a bound of the new policy is past its sanity ceiling (check --allow-loose-bounds)",
    "override-without-reason": "an override table of the new policy gives no reason",
    "gate-settings": "the policy under review changes the gate's own setting ([gate] max_margin_growth)",
    "margin-growth": "a lowering's worst error margin grew by more than max_margin_growth of its tolerance",
    "lse-dropped": "a lowering whose LSE the baseline checked returns none now (it declares lse_base None): its "
                   "output is judged alone",
}


@dataclass(frozen=True)
class Problem:
    """One reason the gate fails: `rule` (a key of RULES, or None: never accepted) and the message."""

    rule: str | None
    text: str

    def __post_init__(self) -> None:
        if self.rule is not None and self.rule not in RULES:
            raise ValueError(f"unknown gate rule {self.rule!r}")

    def line(self) -> str:
        return f"**{self.rule}**: {self.text}" if self.rule else self.text


# ---- the new run itself -----------------------------------------------------------------------------------

def verdict_problems(baseline: dict[str, Any], new: dict[str, Any]) -> list[Problem]:
    """baseline-failed; a new run interrupted (never accepted), judging nothing, or not passing (a failing
    lowering is named by its own comparison)."""
    out = []
    if baseline["verdict"] != "pass":
        bad = [k for k, v in baseline["lowerings"].items() if v.get("status") == "fail"]
        out.append(Problem("baseline-failed", f"the baseline's verdict is `{baseline['verdict']}`"
                                              + (f" (failing: {', '.join(_c(b) for b in bad)})" if bad else "")))
    if new["verdict"] == "interrupted":
        out.append(Problem(None, "the new run was interrupted: a partial run, not a verdict"))
    elif new["verdict"] == "nothing judged":
        out.append(Problem("nothing-judged", "the new run judged no case at all (every lowering unavailable, or "
                                             "every case unsupported)"))
    elif new["verdict"] != "pass" and not any(v.get("status") == "fail" for v in new["lowerings"].values()):
        out.append(Problem(None, f"the new report's verdict is `{new['verdict']}`"))
    return out


def identity_problems(new: dict[str, Any], not_before: _dt.datetime | None, commit: str | None) -> list[Problem]:
    """The new report is not the run the caller named: started before `not_before` (an aware datetime), or
    at a checkout other than `commit` (a SHA prefix). Never accepted."""
    out = []
    if not_before is not None and parse_time(new["started"], "NEW started") < not_before:
        out.append(Problem(None, f"the new report is stale: its run started {_t(new['started'])}, before "
                                 f"--not-before {not_before.isoformat()} (the run that should have written "
                                 f"it did not)"))
    if commit:
        got = str((new.get("git") or {}).get("commit") or "")
        if not got or not got.lower().startswith(commit.lower()):
            out.append(Problem(None, f"the new report is from commit {_t(got or 'unknown (not recorded)')}, not "
                                     f"--commit {commit}"))
    return out


def shard_problems(baseline: dict[str, Any], new: dict[str, Any]) -> list[Problem]:
    """A report of one shard on either side: its cases alone would miss the other shards'. Never accepted."""
    out = []
    for what, r in (("the new report", new), ("the baseline", baseline)):
        if r["settings"].get("shard") is not None:
            out.append(Problem(None, f"{what} is shard {_t(r['settings']['shard'])} of a run split over machines: "
                                     f"merge the shards' reports first (`dflash-parity merge DIR... --report OUT`) "
                                     f"and gate the merged report"))
    return out


# ---- the settings and the policy ----------------------------------------------------------------------

def settings_problems(o: dict[str, Any], n: dict[str, Any]) -> list[Problem]:
    """hardening-off, isolation-off, settings-changed."""
    so, sn = o["settings"], n["settings"]
    out = []
    if so.get("hardening") and not sn.get("hardening"):
        out.append(Problem("hardening-off", "the new run used --no-hardening (no untouched-input, determinism, "
                                            "canary or output-buffer checks); the baseline was hardened"))
    ko, kn = int(so.get("kernel_names_every") or 0), int(sn.get("kernel_names_every") or 0)
    if ko and (not kn or kn > ko):
        out.append(Problem("hardening-off", f"kernel names profiled on one case in {kn or 'no'} "
                                            f"{'cases' if kn else 'case'} (--kernel-names-every {kn}); the baseline "
                                            f"one in {ko}"))
    if so.get("isolation") and not sn.get("isolation"):
        out.append(Problem("isolation-off", "the new run ran its cases in process (--no-isolate); the baseline "
                                            "isolated them"))
    for key in ("device", "profile", "seed", "derandomized"):
        if so.get(key) != sn.get(key):
            out.append(Problem("settings-changed", f"{key}: baseline {_t(repr(so.get(key)))}, new {_t(repr(sn.get(key)))}"))
    if sorted(map(str, so.get("limits", []))) != sorted(map(str, sn.get("limits", []))):
        out.append(Problem("settings-changed", f"--limit: baseline {_t(so.get('limits'))}, new {_t(sn.get('limits'))}"))
    return out


def gate_setting_problems(baseline: dict[str, Any], new: dict[str, Any], growth: float, growth_from: str) -> list[Problem]:
    """gate-settings: the policy under review sets another `[gate] max_margin_growth` than the baseline's."""
    go, gn = baseline["policy"].get("max_margin_growth"), new["policy"].get("max_margin_growth")
    if go == gn:
        return []
    return [Problem("gate-settings", f"the new policy sets [gate] max_margin_growth {gn}, the baseline "
                                     f"{go}; the gate uses {growth:g} ({growth_from})")]


def base_defaults(baseline: dict[str, Any]) -> dict[str, Any]:
    """`{dtype: {key: bound}}` of the baseline's bounds sourced from its defaults (any lowering's)."""
    out: dict[str, Any] = {}
    for per in baseline["policy"]["bounds"].values():
        for dtype, keys in per.items():
            for key, b in keys.items():
                if str(b.get("source", "")).startswith("defaults."):
                    out.setdefault(dtype, {})[key] = b
    return out


def _past_ceiling(key: str, dtype: str, val: Any) -> Ceiling | None:
    """The sanity ceiling of `key` and `dtype` that `val` is past (None: within it, or none for them)."""
    ceiling = CEILINGS.get(key)
    if ceiling is not None and dtype in ceiling.per_dtype and float(val) > ceiling.per_dtype[dtype]:
        return ceiling
    return None


def bound_problems(name: str, ob: dict[str, Any] | None, nb: dict[str, Any], base_defaults: dict[str, Any]) -> list[Problem]:
    """looser-bounds, loose-bounds, override-without-reason for one lowering's recorded bounds."""
    out: list[Problem] = []
    for dtype, keys in sorted(nb.items()):
        for key, b in sorted(keys.items()):
            val, src, why = float(b.get("value", 0.0)), str(b.get("source", "")), str(b.get("reason", "")).strip()
            at = f"{_c(name)} {_t(dtype)} {_t(key)}"
            ceiling = _past_ceiling(key, dtype, val)
            if ceiling is not None:
                out.append(Problem("loose-bounds", f"{at} = {val:g} is past the sanity ceiling "
                                                   f"{ceiling.per_dtype[dtype]:g} ({ceiling.reason}); from {_c(src)}"))
            if src.startswith("lowering.") and not why:
                out.append(Problem("override-without-reason", f"{at} = {val:g} comes from {_c(src)}, "
                                                              f"which gives no reason"))
            if ob is not None:
                old = ob.get(dtype, {}).get(key)
                against = "the baseline"
            else:
                old = base_defaults.get(dtype, {}).get(key)
                against = "the baseline's defaults (a lowering new to the gate)"
            if old is None and key in OPTIONAL_KEYS:  # a baseline that predates the key had none of it: 0
                old, against = {"value": 0.0, "source": "absent"}, against + ", where this key did not exist: 0"
            if old is not None and val > float(old.get("value", 0.0)):
                out.append(Problem("looser-bounds", f"{at} got looser: {float(old['value']):g} "
                                                    f"({against}, {_c(old.get('source', '?'))}) -> {val:g} ({_c(src)}: "
                                                    f"{_t(why or 'no reason given')})"))
    return out


def _kernel_old(key: str, dtype: str, before: dict[str, Any] | None, base_defaults: dict[str, Any]):
    """`(old value or None, against what)` a kernel entry's `key` is compared with."""
    if before is not None and key in before:
        return float(before[key]), "the baseline's same entry"
    b = base_defaults.get(dtype, {}).get(key)  # a new entry, or a key the baseline's entry left to the defaults
    old = None if b is None else float(b.get("value", 0.0))
    against = ("the baseline's defaults (a new kernel entry)" if before is None
               else "the baseline's defaults (a key new to this kernel entry)")
    if old is None and key in OPTIONAL_KEYS:  # a baseline that predates the key had none of it: 0
        old, against = 0.0, against + ", where this key did not exist: 0"
    return old, against


def kernel_entry_problems(po: dict[str, Any], pn: dict[str, Any], base_defaults: dict[str, Any]) -> list[Problem]:
    """looser-bounds and loose-bounds for the `[kernel."<key>".<dtype>]` entries of the new policy: they set
    the bounds of whichever cases ran that kernel (chosen per case, so no lowering's recorded bounds show
    them). Each value is compared with the same entry in the baseline, else with the baseline's defaults."""
    out: list[Problem] = []
    old_over, new_over = po.get("overrides", {}), pn.get("overrides", {})
    for entry, e in sorted(new_over.items()):
        if not entry.startswith("kernel."):
            continue
        dtype = entry.rsplit(".", 1)[-1]
        before = old_over.get(entry, {}).get("values")
        for key, val in sorted((e.get("values") or {}).items()):
            ceiling = _past_ceiling(key, dtype, val)
            if ceiling is not None:
                out.append(Problem("loose-bounds", f"{_c(entry)} {_t(key)} = {float(val):g} is past the sanity ceiling "
                                                   f"{ceiling.per_dtype[dtype]:g} ({ceiling.reason})"))
            old, against = _kernel_old(key, dtype, before, base_defaults)
            if old is not None and float(val) > old:
                out.append(Problem("looser-bounds", f"{_c(entry)} {_t(key)} got looser: {old:g} ({against}) -> "
                                                    f"{float(val):g} ({_t(e.get('reason') or 'no reason given')})"))
    return out
