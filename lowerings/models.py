"""The production dimension of the case space, as data: attention geometries of the drafters that ship, the shapes
the production lowerings serve (`lowerings.limits.Limits.models` names the rows a check may draw).

Each row is one drafter layer as a serving stack runs it on one rank: query/KV heads, head dim, the
KV-cache page size, the layer kind (DSpark: a non-causal sliding window `W`; DFlash: non-causal,
unwindowed) and the drafter's block size `K`. A drafter copies its target's attention geometry, so
the rows not taken from a seed PR use the target's public config (heads, head dim) with the serving
defaults named in the row (page size, block size). KV dtype, dtype and lengths are drawn per case
(`strategies`' production draws), not fixed by the row.

Rows go from the smallest to the largest: hypothesis shrinks a drawn row towards the first one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """One drafter layer's geometry on one rank. `window`: `("noncausal", None)` (DFlash) or
    `("noncausal_swa", W)` (DSpark), as `strategies.windows` draws them. `source`: where the numbers
    come from."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    window: tuple[str, int | None]
    block_size: int
    source: str

    def __post_init__(self) -> None:
        for f in ("num_q_heads", "num_kv_heads", "head_dim", "page_size", "block_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig {self.name}: {f} must be a positive integer, got {v!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig {self.name}: {self.num_q_heads} query heads are not a multiple of "
                             f"{self.num_kv_heads} KV heads")
        kind, width = self.window
        if kind not in ("noncausal", "noncausal_swa") or (kind == "noncausal_swa") != (width is not None):
            raise ValueError(f"ModelConfig {self.name}: window ('noncausal', None) or ('noncausal_swa', W), "
                             f"got {self.window!r}")

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


MODELS: tuple[ModelConfig, ...] = (
    ModelConfig("gpt-oss-120b/tp8", 8, 1, 64, 16, ("noncausal_swa", 128), 4,
                "gpt-oss-120b: 64 q / 8 kv heads, head dim 64, sliding window 128; one TP8 rank; DSpark block 4"),
    ModelConfig("kimi-k3-dspark/tp8", 8, 2, 64, 32, ("noncausal", None), 7,
                "seed 002: Kimi K3 GQA DSpark drafter, 64/16 heads over TP8, head dim 64, page 32, block 7"),
    ModelConfig("minimax-m3.1-dspark/tp4", 16, 1, 128, 64, ("noncausal_swa", 4096), 7,
                "seed 000: MiniMax-M3.1 DSpark drafter, 16 q / 1 kv heads per TP4 rank, window 4096, "
                "64-token pages, K = 7"),
    ModelConfig("qwen3-8b-dflash/tp2", 16, 4, 128, 32, ("noncausal", None), 16,
                "seed 003: Qwen3-8B DFlash drafter per TP2 rank, 16 q / 4 kv heads, head dim 128, 16 queries, "
                "32-token pages"),
    ModelConfig("llama-3.1-8b-dflash", 32, 8, 128, 16, ("noncausal", None), 16,
                "Llama-3.1-8B: 32 q / 8 kv heads, head dim 128; DFlash block 16 (b16 drafters), vLLM's 16-token pages"),
    ModelConfig("minimax-m3.1-dspark/dp", 64, 4, 128, 64, ("noncausal_swa", 4096), 7,
                "seed 000: MiniMax-M3.1 DSpark drafter under attention DP, 64 q / 4 kv heads, window 4096, "
                "64-token pages"),
    ModelConfig("llama-3.3-70b-dflash", 64, 8, 128, 16, ("noncausal", None), 16,
                "Llama-3.3-70B: 64 q / 8 kv heads, head dim 128; DFlash block 16, 16-token pages"),
)
MODEL_NAMES: tuple[str, ...] = tuple(m.name for m in MODELS)


def model(name: str) -> ModelConfig:
    for m in MODELS:
        if m.name == name:
            return m
    raise ValueError(f"unknown model row {name!r}; known: {', '.join(MODEL_NAMES)}")
