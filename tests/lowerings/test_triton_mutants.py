"""Mutants of the Triton kernels, made by editing the kernel source (one realistic bug each), caught on
CPU under the interpreter and, on a GPU runner, compiled for the GPU (the same tests, on CUDA tensors).

Each mutant is the production module with one textual change, written to a temporary file and
imported (Triton needs kernel source in a file), wrapped as a lowering that calls the mutated launcher.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

import lowerings
from lowerings import counters
from lowerings import kernel_param_is_constexpr, kernel_param_not_specialized, triton_device
from lowerings.protocol import LoweringResult
from lowerings.triton_hybrid import HybridPaged
from lowerings.torch_emulation import WindowedMerge
from parity.engine.policy import load
from parity.engine.runner import RunOptions, check_lowering
from strategies import Limits, cases, profile_settings

ROOT = Path(__file__).resolve().parents[2]
HYBRID = ROOT / "lowerings" / "_hybrid_kernel.py"
MERGE = ROOT / "lowerings" / "_merge_kernel.py"
DEVICE = triton_device()  # the interpreter's CPU on CI, the GPU on a GPU runner


def mutated_module(src: Path, edits: list[tuple[str, str]], name: str, tmp: Path):
    text = src.read_text().replace("from ._triton_env import", "from lowerings._triton_env import")
    for old, new in edits:
        assert old in text, f"mutation site not found in {src.name}: {old!r}"
        text = text.replace(old, new)
    path = tmp / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# (name, source, edits, fixed case fields, expected phrase)
HYBRID_MUTANTS = {
    "fp8_scale_dropped": ([("    acc = acc * v_scale  # fp8 value dequant of the context part (linear: applied once)\n", ""),
                           ("        acc = acc * v_scale\n", "")],
                          dict(kv_dtype="float8_e4m3fn", v_scale=2.0), "output: max |O - O_ref|"),
    # The workspace is torch.empty: a fresh CPU allocation reads as NaN/garbage (non-finite output); on a
    # GPU the caching allocator hands back memory an earlier kernel wrote, often finite, so the same bug
    # shows as a wrong output there (either message is this bug, caught).
    "empty_split_leaves_workspace_unwritten": (
        [("    tl.store(ws_m + off_m, m_i, mask=row_ok)\n    tl.store(ws_l + off_m, l_i, mask=row_ok)",
          "    written = rows < R * (start < end).to(tl.int32)  # the bug: an empty split skips its store\n"
          "    tl.store(ws_m + off_m, m_i, mask=written)\n    tl.store(ws_l + off_m, l_i, mask=written)")],
        dict(batch_size=1), "non-finite" if DEVICE == "cpu" else ("non-finite", "max |O - O_ref|", "LSE")),
    "store_without_row_mask": (
        [("    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])",
          "    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty))")],
        dict(block_size=3, group=2), "past the end"),
}


class _MutantHybrid(HybridPaged):
    def __init__(self, name: str, mod) -> None:
        # A forced split count: the split-KV path (and its empty splits) on the small CPU shapes.
        super().__init__(num_splits=4)
        self.name = f"triton-mutant:{name}"
        self.mod = mod

    def run(self, inputs):
        import lowerings._hybrid_kernel as real

        # The adapter reaches its kernels through `lowerings._hybrid_kernel`: point that at the mutant.
        sys.modules["lowerings._hybrid_kernel"] = lowerings._hybrid_kernel = self.mod
        try:
            return super().run(inputs)
        finally:
            sys.modules["lowerings._hybrid_kernel"] = lowerings._hybrid_kernel = real


def _poison_cuda_allocator(mib: int = 512) -> None:
    """Fill memory the caching allocator will hand out again with NaN, so that a read of memory a kernel
    never wrote shows as it does in a fresh CPU allocation (not as whatever an earlier test left)."""
    import torch

    torch.cuda.synchronize()
    junk = torch.full((mib * 2**18,), float("nan"), dtype=torch.float32, device="cuda")
    del junk  # the block stays cached; the next allocations are carved from it


LIMITS = Limits(max_batch=3, max_context=140, max_kv_heads=2, max_group=4, max_block=8, head_dims=(64,))


@pytest.mark.parametrize("key", sorted(HYBRID_MUTANTS))
def test_hybrid_kernel_mutant_is_caught(key, tmp_path):
    edits, fixed, phrase = HYBRID_MUTANTS[key]
    if key == "store_without_row_mask" and not getattr(HybridPaged, "writes_given_output", False):
        pytest.skip("needs the framework's guarded output buffers (writes_given_output)")
    mod = mutated_module(HYBRID, edits, f"hybrid_mutant_{key}", tmp_path)
    lw = _MutantHybrid(key, mod)
    if DEVICE == "cuda":
        _poison_cuda_allocator()
    t0 = time.perf_counter()
    rep = check_lowering(lw, load(), strategy=cases(lw, limits=LIMITS, **fixed),
                         settings=profile_settings("ci", max_examples=30), opts=RunOptions(device=DEVICE),
                         yardstick=lowerings.get("sdpa"))
    msgs = [m for f in rep.failures for m in f.outcome.failures] + rep.extra
    print(f"{key}: {time.perf_counter() - t0:.1f}s shrunk={rep.failures[0].outcome.case.short() if rep.failures else '-'}")
    assert rep.status == "fail", f"{key} was not caught"
    phrases = (phrase,) if isinstance(phrase, str) else phrase
    assert any(p in m for p in phrases for m in msgs), msgs
    case = rep.failures[0].outcome.case
    assert case.batch_size <= 2 and case.block_size <= 3, case.short()


def test_split_count_as_constexpr_is_caught(tmp_path):
    """A split count baked in as a constexpr compiles one kernel per split count (per batch size). On a
    GPU the compile budget catches it; the interpreter never compiles, so CI checks the kernel signature."""
    real = sys.modules["lowerings._hybrid_kernel"] if "lowerings._hybrid_kernel" in sys.modules else \
        importlib.import_module("lowerings._hybrid_kernel")
    for kernel in (real._hybrid_split_kernel, real._hybrid_merge_splits_kernel):
        assert not kernel_param_is_constexpr(kernel, "num_splits")
        assert kernel_param_not_specialized(kernel, "num_splits")
    mod = mutated_module(HYBRID, [("@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE[\"_hybrid_split_kernel\"])\n"
                                   "def _hybrid_split_kernel(",
                                   "@triton.jit\ndef _hybrid_split_kernel("),
                                  ("max_ctx, num_splits,\n    qk_scale2_ctx, v_scale,",
                                   "max_ctx, num_splits: tl.constexpr,\n    qk_scale2_ctx, v_scale,")],
                         "hybrid_mutant_constexpr", tmp_path)
    assert kernel_param_is_constexpr(mod._hybrid_split_kernel, "num_splits")


def test_merge_kernel_mutant_base_not_converted_is_caught(tmp_path):
    """The one-kernel merge taking part A's base-2 LSE as natural log."""
    import lowerings._merge_kernel as real_merge

    # The conversion of part A's LSE into log2 units taken as if the LSE were natural log.
    mod = mutated_module(MERGE, [("    a_to_log2 = ln_base / LN2  # exactly 1.0 for base 2",
                                  "    a_to_log2 = 1.0 / LN2")], "merge_mutant_base", tmp_path)

    class MutantMerge(WindowedMerge):
        def run(self, inputs):
            saved = real_merge.merge_future_block_keys_triton
            real_merge.merge_future_block_keys_triton = mod.merge_future_block_keys_triton
            try:
                return super().run(inputs)
            finally:
                real_merge.merge_future_block_keys_triton = saved

    lw = MutantMerge(form="triton")
    lw.name = "triton-mutant:merge_base"
    rep = check_lowering(lw, load(), strategy=cases(lw, limits=Limits(max_batch=2, max_context=40, head_dims=(64,))),
                         settings=profile_settings("ci", max_examples=30), opts=RunOptions(device=DEVICE),
                         yardstick=lowerings.get("sdpa"))
    assert rep.status == "fail"
    msgs = [m for f in rep.failures for m in f.outcome.failures]
    assert any("LSE" in m or "ulp" in m for m in msgs), msgs
    assert rep.failures[0].outcome.case.batch_size == 1 and rep.failures[0].outcome.case.block_size == 2


def test_int32_offset_mutant_is_exact_below_2_31_pool_elements():
    """tests/gpu_mutants.py's hybrid kernel with 32-bit pool offsets (caught by the GPU `scale` profile, in
    tests/lowerings/test_gpu_mutants.py) is the production kernel on every pool of the CPU profiles: it
    passes them, so what fails it on a GPU is the pool past 2**31 elements and nothing else."""
    from parity.engine.runner import run_case
    from strategies import build_case
    from tests.gpu_mutants import INT32_OFFSET_EDITS, HybridInt32Offsets

    src = (ROOT / "lowerings" / "_hybrid_kernel.py").read_text()
    assert all(old in src for old, _ in INT32_OFFSET_EDITS)
    lw = HybridInt32Offsets()
    case = build_case(dict(context_lens=[37, 5], block_size=3, num_kv_heads=2, group=2, head_dim=64, page_size=16,
                           window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0,
                           scale=None, layout="NHD", block_storage="dense", page_table_dtype="int32", page_table_pad=0,
                           spare_pages=1, extra_pages=0, perm_seed=5, seed=1))
    out = run_case(lw, case, load(), RunOptions(device=DEVICE), lowerings.get("sdpa"))
    assert out.status == "pass", out.failures
