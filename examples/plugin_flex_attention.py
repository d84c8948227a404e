"""An outside kernel plugged in as a new user would: PyTorch's `flex_attention` (eager, any device), checked with
`dflash-parity check --plugin examples/plugin_flex_attention.py --lowering flex_attention`.

The paged pool is gathered into dense `[B, Hkv, T, D]` keys and values in the working dtype (an fp8 pool dequantized
and rounded to it, as a working-dtype kernel reads it), positions past a request's keys masked; the case's
visibility (docs/semantics.md 2: the window around query `i` at position `L + i`) is a `mask_mod`. flex_attention
returns the LSE in natural log. docs/lab/flex-attention.md says what its eager arithmetic costs and why the verdict
passes it.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from lowerings import BASE_E, LoweringResult, counters, register
from lowerings.torch_emulation import TorchLoweringBase
from oracle.reference import gather_keys

# Eager on purpose (the math the docstring describes), so torch's advice to compile it is not news here.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


class FlexAttention(TorchLoweringBase):
    name = "flex_attention"
    lse_base = BASE_E

    def expected_calls(self, case):
        return {"torch.flex_attention": 1}

    def run(self, inputs):
        c = inputs.case
        B, K, Hq, Hkv, D, T = c.batch_size, c.block_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.max_keys
        lens = inputs.context_lens.to(torch.long)
        k, v, valid = gather_keys(inputs, 0, T, lens, torch.float32, kv_rounded=True)  # [B, T, Hkv, D]
        k = k.to(inputs.q.dtype).transpose(1, 2).contiguous()
        v = v.to(inputs.q.dtype).transpose(1, 2).contiguous()
        left, right = c.window

        def visible(b, h, i, t):
            p = lens[b] + i
            ok = valid[b, t] & (t < lens[b] + K)
            if left != -1:
                ok = ok & (t >= p - left)
            if right != -1:
                ok = ok & (t <= p + right)
            return ok

        mask = create_block_mask(visible, B, None, K, T, device=inputs.q.device)
        counters.record("torch.flex_attention")
        out, lse = flex_attention(inputs.q.transpose(1, 2), k, v, block_mask=mask, scale=c.softmax_scale,
                                  enable_gqa=Hq != Hkv, return_lse=True)
        return LoweringResult(out=out.transpose(1, 2).contiguous(), lse=lse.transpose(1, 2).float())


register(FlexAttention())
