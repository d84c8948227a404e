"""The built-in lowerings, listed in one place. The registry registers them on first use
(`lowerings.registry`); importing this module registers nothing, and nothing it imports imports the
registry: no import circle."""

from __future__ import annotations

from lowerings import flashinfer
from lowerings.protocol import Lowering
from lowerings.torch_emulation import Context, DecodeRows, Sdpa, WindowedMerge
from lowerings.triton_hybrid import HybridPaged

TORCH_MERGE_FORMS = ("eager", "compiled", "triton")


def builtin_lowerings() -> list[Lowering]:
    """Fresh instances of every built-in lowering, in registration order: the torch decompositions, the
    Triton hybrid kernel (one split heuristic, four splits), the flashinfer adapters."""
    return [Sdpa(), Context(), DecodeRows(), *(WindowedMerge(form=f) for f in TORCH_MERGE_FORMS),
            HybridPaged(), HybridPaged(num_splits=4), *flashinfer.adapters()]
