"""Production lowerings as adapters: the `Lowering` protocol, the registry and the built-ins.

A user's plugin file::

    from lowerings import register, LoweringResult
    class MyKernel:
        name = "my_kernel"; devices = ("cuda",); lse_base = 2.0; deterministic = True; max_compiles = None
        def available(self, device): return (True, "")
        def supports(self, case): return None
        def expected_calls(self, case): return {"my_kernel": 1}
        def run(self, inputs): ...  # -> LoweringResult(out, lse)
    register(MyKernel())

A kernel that returns no LSE declares `lse_base = NO_LSE` and returns `LoweringResult(out, lse=None)`.
"""

from lowerings._triton_env import interpret_where_no_gpu

interpret_where_no_gpu()  # before anything imports triton.language (torch._dynamo does): see _triton_env

from lowerings.counters import KernelCounter, counted, record, record_compile  # noqa: E402
from lowerings.protocol import BASE_2, BASE_E, NO_LSE, Lowering, LoweringResult, Partial  # noqa: E402
from lowerings.registry import all_lowerings, get, load_plugin, names, register, unregister  # noqa: E402

__all__ = [
    "BASE_2", "BASE_E", "NO_LSE", "KernelCounter", "Lowering", "LoweringResult", "Partial", "all_lowerings",
    "counted", "get", "load_plugin", "names", "record", "record_compile", "register", "unregister",
]
