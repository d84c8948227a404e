#!/usr/bin/env python3
"""GPU smoke run of the flashinfer lowerings (lowerings/flashinfer/) on one CUDA GPU.

For each flashinfer adapter, a handful of fixed cases (B in {1, 32, 33}, K in {1, 3, 7}, G in {1, 4, 8}
(+6, 5), L in {0, 15, 16, 17, 300}, NHD/HND, bf16 and fp8 KV with scales 0.5/2.0, windows for the
windowed merges) go through `parity.engine.runner.run_case` against the fp32 oracle with the SDPA yardstick.
One verdict line per case, a summary table, timings (the first case of each adapter includes
flashinfer's JIT compile: decode ~15 s, fa2 ~29 s, fa3 ~94 s per dtype / head dim / window on-off),
and, per adapter, one run under torch.profiler that lists the CUDA kernels it launched and checks them
against `kernel_families(case)` / `forbidden_kernel_families(case)`. An adapter that raises does not
stop the others.

    python scripts/gpu_flashinfer_smoke.py                      # everything (~6-8 min of JIT, cold)
    python scripts/gpu_flashinfer_smoke.py --skip fa3           # all but the fa3 context (JIT ~4 min)
    python scripts/gpu_flashinfer_smoke.py --only fa3           # just the fa3 context
    python scripts/gpu_flashinfer_smoke.py --extended           # + head_dim 64, page sizes 1/3, fp16
    python scripts/gpu_flashinfer_smoke.py --list               # the cases, nothing run
    python scripts/gpu_flashinfer_smoke.py --selftest-fake      # CPU self-test of this script (no GPU)

Results also go to JSON (`--json PATH`, default `$OUT/flashinfer_smoke.json` when `$OUT` is set),
rewritten after every adapter so that a run cut short still leaves what it finished. Exit status 0
when nothing failed or errored (unsupported and unavailable are not failures), else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lowerings._triton_env import ensure_interpreter_on_cpu  # noqa: E402

ensure_interpreter_on_cpu()  # only where torch sees no GPU (the --selftest-fake run): Triton's interpreter

import torch  # noqa: E402

import lowerings  # noqa: E402
from lowerings import flashinfer as fp  # noqa: E402
from oracle.inputs import materialize  # noqa: E402
from parity.engine import policy as policy_mod  # noqa: E402
from parity.engine.runner import RunOptions, run_case  # noqa: E402
from strategies import build_case  # noqa: E402

FP8 = "float8_e4m3fn"
L32 = [0, 15, 16, 17, 300] * 6 + [16, 17]  # 32 requests
L33 = L32 + [300]


def P(**kw) -> dict:
    p = dict(context_lens=[17], block_size=3, num_kv_heads=2, group=4, head_dim=128, page_size=16,
             window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
             layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0, spare_pages=2,
             extra_pages=1, perm_seed=11, seed=5)
    p.update(kw)
    return p


UNWINDOWED = [
    ("b1_k1_g1_L0", P(context_lens=[0], block_size=1, group=1)),
    ("b1_k3_g4_L17_hnd", P(context_lens=[17], block_size=3, group=4, layout="HND")),
    ("b1_k7_g8_L300", P(context_lens=[300], block_size=7, group=8)),
    ("b32_k7_g8_mix_appended_i64pad", P(context_lens=L32, block_size=7, group=8, block_storage="appended",
                                        page_table_dtype="int64", page_table_pad=3)),
    ("b33_k3_g4_mix_hnd", P(context_lens=L33, block_size=3, group=4, layout="HND")),
    ("b33_k7_g1_mix_fp8", P(context_lens=L33, block_size=7, group=1, kv_dtype=FP8, k_scale=0.5, v_scale=2.0)),
    ("b2_k3_g4_fp8_s.5_2", P(context_lens=[15, 300], block_size=3, group=4, kv_dtype=FP8, k_scale=0.5, v_scale=2.0)),
    ("b32_k7_g6_fp8_s2_.5_hnd", P(context_lens=L32, block_size=7, group=6, kv_dtype=FP8, k_scale=2.0, v_scale=0.5,
                                  layout="HND")),
    ("b2_k3_g5", P(context_lens=[16, 17], block_size=3, group=5)),
    ("b2_k7_swa8", P(context_lens=[300, 16], block_size=7, group=4, window=("noncausal_swa", 8))),
    ("b1_k7_swa3", P(context_lens=[300], block_size=7, group=4, window=("noncausal_swa", 3))),
]
UNWINDOWED_EXT = [
    ("b2_k3_g4_d64", P(context_lens=[17, 300], block_size=3, group=4, head_dim=64)),
    ("b2_k4_g4_ps1", P(context_lens=[15, 17], block_size=4, group=4, page_size=1)),
    ("b2_k5_g8_ps3_hnd", P(context_lens=[16, 300], block_size=5, group=8, page_size=3, layout="HND")),
    ("b2_k3_g4_fp16", P(context_lens=[0, 300], block_size=3, group=4, dtype="float16")),
    ("b2_k3_g4_ps32", P(context_lens=[31, 33], block_size=3, group=4, page_size=32)),
]
WINDOWED = [
    ("b1_k7_g4_L300_w4", P(context_lens=[300], block_size=7, group=4, window=("noncausal_swa", 4))),
    ("b32_k3_g8_mix_hnd_w2", P(context_lens=L32, block_size=3, group=8, layout="HND", window=("noncausal_swa", 2))),
    ("b2_k1_w4_nomerge", P(context_lens=[0, 17], block_size=1, group=1, window=("noncausal_swa", 4))),
    ("b2_k7_causal_swa8_nomerge", P(context_lens=[16, 15], block_size=7, group=4, window=("causal_swa", 8))),
    ("b3_k7_g8_noncausal", P(context_lens=[0, 17, 300], block_size=7, group=8, window=("noncausal", None))),
    ("b2_k7_fp8_w5", P(context_lens=[15, 300], block_size=7, group=4, window=("noncausal_swa", 5), kv_dtype=FP8,
                       k_scale=0.5, v_scale=2.0)),
    ("b33_k7_g4_w16_mix_appended", P(context_lens=L33, block_size=7, group=4, window=("noncausal_swa", 16),
                                     block_storage="appended")),
]
WINDOWED_EXT = [
    ("b2_k3_g4_d64_w2", P(context_lens=[17, 0], block_size=3, group=4, head_dim=64, window=("noncausal_swa", 2))),
    ("b2_k5_g4_ps3_w3", P(context_lens=[16, 9], block_size=5, group=4, page_size=3, window=("noncausal_swa", 3))),
]
TRTLLM = [("b2_k3_g4", P(context_lens=[17, 300], block_size=3, group=4, layout="HND"))]

# Cheap JIT first; fa3 (94 s per module) last but one.
ORDER = ["decode_rows[flashinfer]", "decode_rows[flashinfer-tc]", "context[flashinfer-fa2]",
         "windowed_merge[flashinfer-eager]", "windowed_merge[flashinfer-merge_state]",
         "windowed_merge[flashinfer-triton]", "windowed_merge[flashinfer-compiled]",
         "context[flashinfer-fa3]", "trtllm_gen[decode]", "trtllm_gen[context]"]


def cases_for(name: str, extended: bool) -> list[tuple[str, dict]]:
    if name.startswith("windowed_merge"):
        return WINDOWED + (WINDOWED_EXT if extended else [])
    if name.startswith("trtllm_gen"):
        return TRTLLM
    return UNWINDOWED + (UNWINDOWED_EXT if extended else [])


def say(msg: str = "") -> None:
    print(msg, flush=True)


def env_header() -> dict:
    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = "sm_%d%d" % torch.cuda.get_device_capability()
    ok, why = fp.flashinfer_status()
    info["flashinfer"] = why
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as exc:  # pragma: no cover
        info["triton"] = f"not importable ({exc})"
    return info


def fmt_fig(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def verdict_line(adapter: str, cid: str, out, secs: float) -> str:
    ulp = out.figure("out_ulp")
    rel = out.figure("out_rel_l2")
    lse = out.figure("lse_max_abs")
    head = f"{adapter:40s} {cid:30s} {out.status.upper():11s} {secs:7.2f}s"
    if out.status == "unsupported":
        return f"{head}  {out.reason}"
    figs = f"ulp={fmt_fig(ulp, '.2f')} relL2={fmt_fig(rel, '.2e')} lse={fmt_fig(lse, '.1e')} margin={out.margin:.2f}"
    parts = ",".join(c.label.replace("partial ", "") for c in out.comparisons[1:])
    tail = f" partials[{parts}]" if parts else ""
    if out.status == "fail":
        return f"{head}  {figs}{tail}\n    FAIL: " + "\n    FAIL: ".join(out.failures)
    return f"{head}  {figs}{tail}"


def cuda_kernel_names(adapter, case) -> list[str]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    inputs = materialize(case, "cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        adapter.run(inputs)
        torch.cuda.synchronize()
    events = list(prof.events())
    names: list[str] = []
    for e in events:
        if getattr(e, "device_type", None) == DeviceType.CUDA and e.name not in names:
            names.append(e.name)
    if not names:  # a torch whose events carry no device type: every event name, marked
        names = ["(all events) " + n for n in dict.fromkeys(e.name for e in events)]
    return names


def kernel_check(adapter, case) -> dict:
    names = cuda_kernel_names(adapter, case)
    want = adapter.kernel_families(case) if hasattr(adapter, "kernel_families") else {}
    bad = adapter.forbidden_kernel_families(case) if hasattr(adapter, "forbidden_kernel_families") else {}
    missing = {k: v for k, v in want.items() if not any(v in n for n in names)}
    present = {k: v for k, v in bad.items() if any(v in n for n in names)}
    return {"kernels": names, "missing": missing, "forbidden_present": present, "ok": not missing and not present}


def install_fake_flashinfer() -> None:
    import types

    sys.path.insert(0, str(ROOT / "tests" / "lowerings"))
    import test_flashinfer_adapters as T

    fi = types.ModuleType("flashinfer")
    fi.__version__ = "fake"
    page = types.ModuleType("flashinfer.page")
    page.append_paged_kv_cache = T.fake_append_paged_kv_cache
    page.get_batch_indices_positions = T.fake_get_batch_indices_positions
    fi.page = page
    fi.BatchDecodeWithPagedKVCacheWrapper = T.FakeDecodeWrapper
    fi.BatchPrefillWithPagedKVCacheWrapper = T.FakePrefillWrapper
    fi.merge_state_in_place = T.fake_merge_state_in_place
    sys.modules["flashinfer"] = fi
    sys.modules["flashinfer.page"] = page


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="run adapters whose name contains this (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="skip adapters whose name contains this (repeatable)")
    ap.add_argument("--extended", action="store_true", help="also head_dim 64, page sizes 1/3/32, fp16 (more JIT)")
    ap.add_argument("--no-profile", action="store_true", help="skip the torch.profiler kernel-name check")
    ap.add_argument("--json", default=None, help="result file (default $OUT/flashinfer_smoke.json if $OUT is set)")
    ap.add_argument("--list", action="store_true", help="list adapters and cases, run nothing")
    ap.add_argument("--selftest-fake", action="store_true",
                    help="run on CPU against the fake flashinfer of tests/lowerings/test_flashinfer_adapters.py "
                         "(checks this script and the adapters' glue without a GPU; trtllm-gen stays unavailable)")
    args = ap.parse_args(argv)

    lowerings.names()  # built-ins first
    lowerings.registry.register_new(fp.adapters())
    names = [n for n in ORDER if n in fp.ADAPTER_NAMES]
    names += [n for n in fp.ADAPTER_NAMES if n not in names]
    if args.only:
        names = [n for n in names if any(s in n for s in args.only)]
    names = [n for n in names if not any(s in n for s in args.skip)]

    if args.list:
        for n in names:
            say(n)
            for cid, p in cases_for(n, args.extended):
                say(f"    {cid:32s} {build_case(p).short()}")
        return 0

    device = "cuda"
    if args.selftest_fake:
        install_fake_flashinfer()
        device = "cpu"
        args.no_profile = True
    json_path = args.json
    if json_path is None and os.environ.get("OUT"):
        json_path = os.path.join(os.environ["OUT"], "flashinfer_smoke.json")
    header = env_header()
    say("flashinfer smoke: " + ", ".join(f"{k}={v}" for k, v in header.items()))
    policy = policy_mod.load()
    yard = lowerings.get("sdpa")
    opts = RunOptions(device=device)
    results: dict = {"env": header, "adapters": {}}
    t_all = time.perf_counter()

    def dump() -> None:
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(results, indent=1, default=str))

    for name in names:
        rec = {"available": None, "reason": "", "cases": [], "seconds": 0.0, "kernel_check": None, "error": None}
        results["adapters"][name] = rec
        t_ad = time.perf_counter()
        say(f"\n=== {name}")
        try:
            adapter = lowerings.get(name)
            ok, why = adapter.available("cuda")
            if args.selftest_fake and not name.startswith("trtllm_gen"):
                ok, why = True, "fake flashinfer on CPU (self-test)"
            rec["available"], rec["reason"] = ok, why
            if not ok:
                say(f"{name:40s} {'-':30s} UNAVAILABLE  {why}")
                dump()
                continue
            say(f"    available: {why}")
            first_supported = None
            for cid, p in cases_for(name, args.extended):
                crec = {"id": cid}
                t0 = time.perf_counter()
                try:
                    case = build_case(p)
                    crec["case"] = case.short()
                    out = run_case(adapter, case, policy, opts, yardstick=yard)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    secs = time.perf_counter() - t0
                    crec.update(status=out.status, seconds=round(secs, 3), reason=out.reason, failures=out.failures,
                                calls=out.calls, expected_calls=out.expected_calls, margin=out.margin,
                                out_ulp=out.figure("out_ulp"), out_rel_l2=out.figure("out_rel_l2"),
                                lse_max_abs=out.figure("lse_max_abs"),
                                partials={c.label: c.figures for c in out.comparisons[1:]})
                    line = verdict_line(name, cid, out, secs)
                    if first_supported is None and out.status != "unsupported":
                        line += "   (first run: includes JIT)"
                        first_supported = case
                    say(line)
                except Exception as exc:  # materialize / oracle / anything outside the lowering
                    secs = time.perf_counter() - t0
                    crec.update(status="error", seconds=round(secs, 3), error=f"{type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc())
                    say(f"{name:40s} {cid:30s} {'ERROR':11s} {secs:7.2f}s  {type(exc).__name__}: {exc}")
                rec["cases"].append(crec)
            if first_supported is not None and not args.no_profile:
                try:
                    kc = kernel_check(adapter, first_supported)
                    rec["kernel_check"] = kc
                    say(f"    kernels ({first_supported.short()}):")
                    for k in kc["kernels"]:
                        say(f"      {k[:160]}")
                    say(f"    kernel families: {'OK' if kc['ok'] else 'MISMATCH'}"
                        + (f"  missing={kc['missing']}" if kc["missing"] else "")
                        + (f"  forbidden present={kc['forbidden_present']}" if kc["forbidden_present"] else ""))
                except Exception as exc:
                    rec["kernel_check"] = {"error": f"{type(exc).__name__}: {exc}"}
                    say(f"    kernel check raised {type(exc).__name__}: {exc}")
        except Exception as exc:  # one broken adapter never stops the rest
            rec["error"] = f"{type(exc).__name__}: {exc}"
            rec["traceback"] = traceback.format_exc()
            say(f"{name:40s} ADAPTER ERROR {type(exc).__name__}: {exc}")
            say(traceback.format_exc())
        rec["seconds"] = round(time.perf_counter() - t_ad, 2)
        dump()

    # ---- summary ----------------------------------------------------------------------------------
    say("\n=== summary")
    say(f"{'adapter':40s} {'pass':>4s} {'fail':>4s} {'unsup':>5s} {'err':>3s} {'secs':>7s} {'worst ulp':>9s} "
        f"{'worst relL2':>11s} {'margin':>6s} kernels")
    bad = 0
    for name, rec in results["adapters"].items():
        if rec["available"] is False:
            say(f"{name:40s} unavailable: {rec['reason']}")
            continue
        cs = rec["cases"]
        n = {s: sum(c.get("status") == s for c in cs) for s in ("pass", "fail", "unsupported", "error")}
        if rec["error"]:
            n["error"] += 1
        bad += n["fail"] + n["error"]
        ran = [c for c in cs if c.get("status") in ("pass", "fail")]
        wu = max((c["out_ulp"] for c in ran if c.get("out_ulp") is not None), default=None)
        wr = max((c["out_rel_l2"] for c in ran if c.get("out_rel_l2") is not None), default=None)
        wm = max((c["margin"] for c in ran if c.get("margin") is not None), default=None)
        kc = rec.get("kernel_check")
        kstat = "-" if not kc else ("error" if "error" in kc else ("OK" if kc["ok"] else "MISMATCH"))
        if kc and kstat == "MISMATCH":
            bad += 1
        say(f"{name:40s} {n['pass']:4d} {n['fail']:4d} {n['unsupported']:5d} {n['error']:3d} {rec['seconds']:7.1f} "
            f"{fmt_fig(wu, '9.2f')} {fmt_fig(wr, '11.2e')} {fmt_fig(wm, '6.2f')} {kstat}")
    total = time.perf_counter() - t_all
    say(f"total {total:.1f}s; {'OK' if bad == 0 else f'{bad} failure(s)/error(s)'}")
    results["total_seconds"] = round(total, 1)
    dump()
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
