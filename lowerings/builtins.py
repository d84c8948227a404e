"""Registers the built-in lowerings (imported once by the registry)."""

from lowerings.registry import register
from lowerings.torch_emulation import Context, DecodeRows, Sdpa, WindowedMerge
from lowerings.triton_hybrid import HybridPaged
from lowerings import flashinfer_paged

register(Sdpa())
register(Context())
register(DecodeRows())
for _form in ("eager", "compiled", "triton"):
    register(WindowedMerge(form=_form))
register(HybridPaged())
register(HybridPaged(num_splits=4))
flashinfer_paged.register_all()
