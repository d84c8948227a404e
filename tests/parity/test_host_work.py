"""The host work a case saves keeps its meaning (issue "Four times the cases per GPU-minute"):

- `fresh_inputs` gives the bits a second build gives (a copy of the pristine inputs, same canary), builds
  again for another canary or another case, and with `take` hands over the pristine set itself;
- the `sdpa` yardstick reads the inputs in place (no copy), gives the bits it gives on a copy, and leaves
  the inputs as they were; a yardstick that does not declare `reads_inputs_only` still gets a copy;
- a case's page table is copied to the device once, not once per request (one synchronization).
"""

from __future__ import annotations

import pytest
import torch

import lowerings
from oracle.inputs import Inputs, materialize
from parity.engine import case_run
from oracle import footprint
from parity.engine.invocation import RunOptions, fresh_inputs, prepare_inputs
from parity.engine.outcome import CaseOutcome
from parity.engine import result_bits as rb
from strategies import build_case


def _case(**over):
    base = dict(context_lens=[5, 17, 0], block_size=4, num_kv_heads=2, group=2, head_dim=16, page_size=4,
                window=("noncausal", None), dtype="bfloat16", kv_dtype="same", k_scale=1.0, v_scale=1.0, scale=None,
                layout="HND", block_storage="dense", page_table_dtype="int32", page_table_pad=3, spare_pages=2,
                extra_pages=1, perm_seed=7, seed=5)
    return build_case(dict(base, **over))


def _same_bits(a: Inputs, b: Inputs) -> bool:
    ta, tb = a.tensors(), b.tensors()
    return all(ta[k].shape == tb[k].shape and ta[k].stride() == tb[k].stride()
               and torch.equal(rb.bit_view(ta[k]), rb.bit_view(tb[k])) for k in ta)


@pytest.mark.parametrize("kv_dtype", ["same", "float8_e4m3fn"])
def test_fresh_inputs_copy_the_pristine_bits_of_a_second_build(kv_dtype):
    case = _case(kv_dtype=kv_dtype, k_scale=0.5 if kv_dtype != "same" else 1.0, v_scale=2.0 if kv_dtype != "same" else 1.0)
    lw, opts = lowerings.get("context"), RunOptions()
    pristine = materialize(case).clone()
    copy, _ = fresh_inputs(lw, case, opts, pristine=pristine)
    rebuilt, _ = prepare_inputs(lw, case, opts)
    assert copy is not pristine and copy.k_pool.data_ptr() != pristine.k_pool.data_ptr()
    assert _same_bits(copy, rebuilt) and _same_bits(copy, pristine)
    # the padded page table keeps its row stride (a lowering reading through it sees the far-off ids)
    assert copy.page_table.stride() == rebuilt.page_table.stride() != (copy.page_table.shape[1], 1)


def test_fresh_inputs_build_again_for_another_canary_or_case_and_take_hands_over():
    case, lw, opts = _case(), lowerings.get("context"), RunOptions()
    pristine = materialize(case).clone()
    other, _ = fresh_inputs(lw, case, opts, "large", pristine=pristine)
    assert other.canary == "large" and _same_bits(other, prepare_inputs(lw, case, opts, "large")[0])
    assert not _same_bits(other, pristine)  # the canary slots differ
    another = _case(seed=6)
    assert _same_bits(fresh_inputs(lw, another, opts, pristine=pristine)[0], prepare_inputs(lw, another, opts)[0])
    taken, _ = fresh_inputs(lw, case, opts, pristine=pristine, take=True)
    assert taken is pristine


def test_fresh_inputs_give_new_poisoned_buffers_to_a_lowering_that_writes_them():
    class Writes:
        writes_given_output = True

    case, opts = _case(), RunOptions()
    pristine = materialize(case).clone()
    inputs, bufs = fresh_inputs(Writes(), case, opts, pristine=pristine)
    assert bufs is not None and inputs.out is bufs[0].view and pristine.out is None


def test_the_sdpa_yardstick_reads_the_inputs_in_place_and_changes_nothing(monkeypatch):
    case = _case()
    sdpa = lowerings.get("sdpa")
    assert sdpa.reads_inputs_only is True
    inputs = materialize(case)
    before = inputs.clone()
    want = sdpa.run_output(inputs.clone())
    clones = []
    real = Inputs.clone
    monkeypatch.setattr(Inputs, "clone", lambda self: clones.append(1) or real(self))
    out = case_run.run_yardstick(sdpa, inputs, RunOptions(), CaseOutcome("x", case, "pass"))
    assert clones == [] and torch.equal(rb.bit_view(out), rb.bit_view(want)) and _same_bits(inputs, before)


def test_a_yardstick_without_the_declaration_still_gets_a_copy(monkeypatch):
    class Writer:
        name = "writer"

        def run_output(self, inputs):
            inputs.q.zero_()  # a yardstick that writes its inputs must not reach the lowering's
            return inputs.q

    case = _case()
    inputs = materialize(case)
    q = inputs.q.clone()
    case_run.run_yardstick(Writer(), inputs, RunOptions(), CaseOutcome("x", case, "pass"))
    assert torch.equal(inputs.q, q)


def test_one_page_table_copy_per_case_not_one_per_request(monkeypatch):
    """The device build finds each request's slots through the page table already built, so a B-request case
    makes no host-to-device copy per request (on CUDA each such copy waits for every queued kernel)."""
    import oracle.inputs as oi

    case = _case(context_lens=[5, 17, 9, 30, 2, 11])
    made = []
    real = torch.tensor

    def counting(data, *a, **k):
        if "device" in k and isinstance(data, (list, tuple)) and tuple(data) in set(case.pages):
            made.append(tuple(data))  # a page row made straight on the build's device: one copy per request
        return real(data, *a, **k)

    monkeypatch.setattr(oi.torch, "tensor", counting)
    a = materialize(case, build="device")
    monkeypatch.setattr(oi.torch, "tensor", real)
    assert made == []
    assert _same_bits(a, materialize(case, build="device"))


def test_a_profiled_case_keeps_its_draw_budget_and_leases_no_copy():
    """`run_bytes` (the draw budget) still counts the pristine copy a profiled case kept until session 17, so the
    drawn cases stay the same; the lease no longer does: the judged call itself is profiled, on no copy."""
    case = _case()
    one = footprint.input_bytes(case)
    plain = footprint.run_bytes(case, hardening=False)
    assert footprint.run_bytes(case, hardening=False, profiled=True) == plain + one
    assert footprint.run_bytes(case, hardening=True, profiled=True) == footprint.run_bytes(case, hardening=True)
    assert footprint.lease_bytes(case, hardening=False) == plain  # no copy leased, profiled or not


def test_the_allocators_unused_bytes_are_reserved_less_allocated_from_one_query(monkeypatch):
    """`memory.free_bytes` on CUDA: the device's free bytes plus the allocator's cached, unused ones, read from one
    nested stats query (the flattened `memory_reserved() - memory_allocated()` cost 1.2 ms a call on the H200)."""
    from parity.exec import memory

    stats = {"reserved_bytes": {"all": {"current": 7 << 20, "peak": 9 << 20}, "large_pool": {"current": 5 << 20}},
             "allocated_bytes": {"all": {"current": 3 << 20}}}
    assert memory.cached_unused_bytes(stats) == 4 << 20
    assert memory.cached_unused_bytes({}) == 0  # CUDA not initialized yet: torch gives {}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (100 << 20, 200 << 20))
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda *a: stats)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: pytest.fail("flattened stats queried"))
    opts = RunOptions(device="cuda")
    assert memory.free_bytes(_case(), opts) == (100 << 20) + (4 << 20)


@pytest.mark.parity_gpu
def test_the_one_query_gives_torchs_reserved_less_allocated_on_a_gpu():
    from parity.exec import memory

    keep = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    del keep  # its block stays cached, unused
    held = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    want = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    assert memory.cached_unused_bytes(torch.cuda.memory_stats_as_nested_dict()) == want > 0
    del held
