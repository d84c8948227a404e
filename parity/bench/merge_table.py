"""Table (b): the merge of the later block keys, us per call per form (seed 000's table).

Timed: the merge alone, on synthetic part-A / block tensors of the shape (one set per rotating input
set); its verdict: the whole `windowed_merge[<form>]` lowering run once on a real case of the same
batch and heads, with a window under which the merge happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from oracle.rules import LN2
from oracle import reference
from oracle.inputs import materialize, torch_dtype
from parity.bench import measure as ms
from parity.bench.shapes import Shape, small_case
from parity.bench.tables import Row, Table, cell_from, row_parity, timing_notes


@dataclass
class MergeTensors:
    """Synthetic inputs of one merge call: part A (`o_a`, base-2 `lse_a`), the block, and flashinfer's
    state-merge operands (`v`, `s` = part A flattened; `v_other`, `s_other` = a part B; `mask`)."""

    q: torch.Tensor
    k_block: torch.Tensor
    v_block: torch.Tensor
    o_a: torch.Tensor
    lse_a: torch.Tensor
    v_other: torch.Tensor
    s_other: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def draw(cls, shape: Shape, device: str, gen: torch.Generator) -> "MergeTensors":
        B, K, Hq, Hkv, D = shape.batch, shape.block, shape.q_heads, shape.kv_heads, shape.head_dim
        dt = torch_dtype(shape.dtype)

        def randn(*dims: int) -> torch.Tensor:
            return torch.randn(dims, generator=gen, device=device)

        s_other = randn(B * K, Hq) + 8.0
        last = (torch.arange(B * K, device=device) % K) == K - 1
        s_other[last] = float("-inf")  # row i = K-1 has no later block key
        return cls(q=randn(B, K, Hq, D).to(dt), k_block=randn(B, K, Hkv, D).to(dt), v_block=randn(B, K, Hkv, D).to(dt),
                   o_a=randn(B, K, Hq, D).to(dt), lse_a=randn(B, K, Hq) + 8.0,
                   v_other=randn(B * K, Hq, D).to(dt), s_other=s_other, mask=(~last).to(torch.uint8))

    @staticmethod
    def nbytes(shape: Shape) -> int:
        B, K, Hq, Hkv, D = shape.batch, shape.block, shape.q_heads, shape.kv_heads, shape.head_dim
        e = shape.element_bytes
        return B * K * (3 * Hq * D * e + 2 * Hkv * D * e + 2 * Hq * 4 + 1) + B * K * Hq * D * e


@dataclass
class MergeForm:
    """A merge as timed: `make(tensors, scale, right)` returns the zero-argument call; its verdict comes from
    running the lowering `verdict_lowering` once on a real case of the same shape."""

    label: str
    verdict_lowering: str
    make: Callable[[MergeTensors, float, int], Callable[[], Any]]
    available: Callable[[str], tuple[bool, str]] = lambda device: (True, "")


def _torch_form(name: str) -> Callable[[MergeTensors, float, int], Callable[[], Any]]:
    def make(t: MergeTensors, scale: float, right: int) -> Callable[[], Any]:
        from lowerings.merges import MERGE_FORMS

        fn = MERGE_FORMS[name]
        return lambda: fn(t.q, t.k_block, t.v_block, t.o_a, t.lse_a, scale=scale, right=right, lse_a_base=2.0)
    return make


def _flashinfer_available(device: str) -> tuple[bool, str]:
    if device != "cuda":
        return False, f"flashinfer runs on cuda only, not {device}"
    from lowerings.flashinfer import flashinfer_status
    return flashinfer_status()


def _triton_available(device: str) -> tuple[bool, str]:
    """Whether the Triton merge runs here: the `windowed_merge[triton]` lowering's own `available`."""
    import lowerings
    return lowerings.get("windowed_merge[triton]").available(device)


def _merge_state_only(t: MergeTensors, scale: float, right: int) -> Callable[[], Any]:
    import flashinfer

    B, K, Hq, D = t.o_a.shape
    v = t.o_a.reshape(B * K, Hq, D)
    s = t.lse_a.reshape(B * K, Hq)
    return lambda: flashinfer.merge_state_in_place(v, s, t.v_other, t.s_other, mask=t.mask)


def _part_b_merge_state(t: MergeTensors, scale: float, right: int) -> Callable[[], Any]:
    """What windowed_merge[flashinfer-merge_state] does after part A: part B in torch, then the in-place
    state merge on copies of part A."""
    import flashinfer

    from lowerings.merges import part_b

    B, K, Hq, D = t.o_a.shape

    def call():
        o_b, lse_b = part_b(t.q, t.k_block, t.v_block, scale=scale, right=right)
        v = t.o_a.reshape(B * K, Hq, D).clone(memory_format=torch.contiguous_format)
        s = t.lse_a.reshape(B * K, Hq).clone(memory_format=torch.contiguous_format)
        v_other = o_b.to(t.o_a.dtype).reshape(B * K, Hq, D).contiguous()
        s_other = (lse_b.float() / LN2).reshape(B * K, Hq).contiguous()
        flashinfer.merge_state_in_place(v, s, v_other, s_other, mask=t.mask)
        return v, s
    return call


def default_merge_forms() -> list[MergeForm]:
    fi = "windowed_merge[flashinfer-merge_state]"
    return [MergeForm("eager", "windowed_merge[eager]", _torch_form("eager")),
            MergeForm("compiled", "windowed_merge[compiled]", _torch_form("compiled")),
            MergeForm("triton", "windowed_merge[triton]", _torch_form("triton"), _triton_available),
            MergeForm("flashinfer merge_state_in_place (state merge only)", fi, _merge_state_only,
                      _flashinfer_available),
            MergeForm("part B + merge_state_in_place", fi, _part_b_merge_state, _flashinfer_available)]


@dataclass
class MergeSpec:
    """us per merge call, per form, heads and batch size (seed 000's table)."""

    batches: tuple[int, ...]
    heads: list[tuple[int, int]]
    forms: list[MergeForm]
    block: int = 7
    head_dim: int = 128
    window: int = 4096  # W: window (W-1, W-1), right = W-1 (seed 000's layers)
    verify_context: int = 64
    page_size: int = 32
    id: str = "merge"

    def count(self, env: ms.BenchEnv) -> int:
        return sum(f.available(env.device)[0] for f in self.forms) * len(self.heads) * len(self.batches)

    def shape(self, B: int, hq: int, hkv: int) -> Shape:
        return Shape(B, self.verify_context, hq, hkv, self.head_dim, block=self.block, page_size=self.page_size,
                     layout="NHD", storage="dense", window=(self.window - 1, self.window - 1))

    def empty(self, timing: str) -> Table:
        return Table(self.id, f"merge of the later block keys, us per call (K={self.block}, D={self.head_dim}, "
                     f"window {self.window}; {timing})", "us", list(self.batches), ["form", "heads"],
                     y_label="us per merge call", complete=False,
                     notes=["Timed: the merge alone on synthetic part-A / block tensors of the shape (part B "
                            "included, except the state-merge-only row); parity: the whole windowed_merge[<form>] "
                            f"lowering run once on a case of the same B and heads, L={self.verify_context}, "
                            f"window ({self.window - 1}, {self.window - 1}) (the merge happens).",
                            "flashinfer merge_state_in_place merges in place: replays merge into the same buffers."])

    def run(self, env: ms.BenchEnv, timing: str, table: Table | None = None) -> Table:
        import lowerings

        t = table or self.empty(timing)
        verdicts: dict[tuple, ms.Verdict] = {}
        cells: dict[tuple, ms.Measurement] = {}
        for hq, hkv in self.heads:
            for B in self.batches:
                shape = self.shape(B, hq, hkv)
                for form in self.forms:
                    ok, why = form.available(env.device)
                    if ok:
                        ok, why = lowerings.get(form.verdict_lowering).available(env.device)
                        why = f"{form.verdict_lowering} (its verdict) unavailable: {why}" if not ok else why

                    def verdict(form=form, shape=shape) -> ms.Verdict:
                        key = (form.verdict_lowering, shape)
                        if key not in verdicts:
                            verdicts[key] = self._verdict(env, form.verdict_lowering, shape)
                        return verdicts[key]

                    def make_fns(n: int, form=form, shape=shape) -> list[Callable[[], Any]]:
                        gen = torch.Generator(device=env.device).manual_seed(env.seed + 7)
                        return [form.make(MergeTensors.draw(shape, env.device, gen), shape.head_dim ** -0.5,
                                          self.window - 1) for _ in range(n)]

                    m = ms.measure_function(env, table=self.id, label=form.label, shape=shape, available=(ok, why),
                                            make_fns=make_fns, set_bytes=MergeTensors.nbytes(shape), verdict=verdict,
                                            where=f"{hq}/{hkv} D={self.head_dim} K={self.block} B={B}")
                    cells[(form.label, hq, hkv, B)] = m
                    t.measurements.append(m)
            self._fold(t, cells)
        return t

    def _verdict(self, env: ms.BenchEnv, name: str, shape: Shape) -> ms.Verdict:
        import lowerings

        lw = lowerings.get(name)
        why = lw.supports(small_case(shape))
        if why:
            return ms.Verdict(False, None, [f"{name} does not support the verify case: {why}"], name)
        inputs = materialize(small_case(shape, seed=env.seed), env.device)
        v, _ = ms.eager_verdict(env, lw, inputs, reference.attention(inputs))
        return v

    def _fold(self, t: Table, cells: dict) -> None:
        t.rows = []
        for form in self.forms:
            for hq, hkv in self.heads:
                mss = [cells[(form.label, hq, hkv, B)] for B in self.batches if (form.label, hq, hkv, B) in cells]
                if not mss:
                    continue
                parity, failed = row_parity(mss)
                t.rows.append(Row(f"{form.label} {hq}/{hkv}", [form.label, f"{hq}/{hkv}"],
                                  {m.shape.batch: cell_from(m) for m in mss}, [], parity, timing_notes(mss),
                                  failed, group=f"{hq}/{hkv} heads"))
