"""An example plugin: a user's own lowering, registered from a file (`--plugin examples/plugin_window_off_by_one.py`).

It copies the windowed merge but anchors part A's window one key too wide (`window_left = W` instead
of `W - 1`: docs/bugs.md row 4), so `dflash-parity check --plugin ... --lowering my_windowed_merge` exits 1
with a shrunk failure file.
"""

from lowerings import BASE_2, LoweringResult, register
from lowerings import counters, paged
from lowerings.merges import merge_eager, merges_future_block_keys
from lowerings.torch_emulation import WindowedMerge, ensure_block_in_pool


class WindowOffByOne(WindowedMerge):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = "my_windowed_merge"

    def run(self, inputs):
        c = inputs.case
        left, right = c.window
        B, K, Hq, D = inputs.q.shape
        ensure_block_in_pool(inputs)
        counters.record("torch.paged_decode", rows=B * K)
        table = inputs.page_table.repeat_interleave(K, dim=0)
        lens = [L + i + 1 for L in inputs.context_lens_host for i in range(K)]
        o_a, lse_a = paged.paged_attention(
            inputs.q.reshape(B * K, 1, Hq, D), inputs.k_pool, inputs.v_pool, table, lens, layout=c.layout,
            page_size=c.page_size, scale=c.softmax_scale,
            window_left=left + 1 if left >= 0 else -1,  # the bug: W keys to the left instead of W - 1
            k_scale=c.k_scale, v_scale=c.v_scale)
        o_a, lse_a = o_a.view(B, K, Hq, D), lse_a.view(B, K, Hq)
        if not merges_future_block_keys(K, right):
            return LoweringResult(out=o_a, lse=lse_a)
        out, lse = merge_eager(inputs.q, inputs.k_block, inputs.v_block, o_a, lse_a, scale=c.softmax_scale,
                               right=right, lse_a_base=BASE_2)
        return LoweringResult(out=out, lse=lse)


register(WindowOffByOne(form="eager"))
