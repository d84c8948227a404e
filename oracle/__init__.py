"""The truth: the case model, its tensors and the fp32/fp64 reference attention (no lowering code here)."""

from oracle.case import CASE_FORMAT_VERSION, Case, pages_needed, window_for
from oracle.errors import InvalidInput
from oracle.inputs import Inputs, materialize
from oracle.reference import OracleResult, attention, future_block_keys_mask, visible
from oracle.ulp import ulp, ulp_bf16, ulp_fp16

__all__ = [
    "CASE_FORMAT_VERSION", "Case", "Inputs", "InvalidInput", "OracleResult", "attention",
    "future_block_keys_mask", "materialize", "pages_needed", "ulp", "ulp_bf16", "ulp_fp16", "visible",
    "window_for",
]
