"""An example plugin: a kernel that returns the output alone (`--plugin examples/plugin_output_only.py`).

torch's `scaled_dot_product_attention`, as a user plugs it in: one call per batch of requests over keys
gathered from the pages (the built-in `sdpa` lowering's `run_output`), and no LSE, since SDPA returns
none. The lowering declares it (`lse_base = NO_LSE`); its output is judged alone and every report says
"LSE unchecked". `dflash-parity check --plugin examples/plugin_output_only.py --lowering my_sdpa` exits 0
on a CPU.
"""

from lowerings import NO_LSE, LoweringResult, register
from lowerings.torch_emulation import Sdpa


class OutputOnlySdpa(Sdpa):
    name = "my_sdpa"
    lse_base = NO_LSE  # run returns lse=None: SDPA computes no LSE

    def run(self, inputs):
        return LoweringResult(out=self.run_output(inputs), lse=None)


register(OutputOnlySdpa())
