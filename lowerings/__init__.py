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
What a lowering may be given is a `Limits` (its optional `case_limits(device)` hook returns one).

Where Triton kernels run (a plugin's too): `ensure_interpreter_on_cpu` (call it before the kernels are decorated),
`interpret_where_no_gpu` (what importing this package does first), `interpreting`, `kernel_is_interpreted`,
`triton_available(device)`, `triton_device()`, and `kernel_param_is_constexpr` / `kernel_param_not_specialized` (a
kernel's argument compiled in, or never specialized on).
"""

from lowerings._triton_env import (ensure_interpreter_on_cpu, interpret_where_no_gpu, interpreting,
                                   kernel_is_interpreted, kernel_param_is_constexpr, kernel_param_not_specialized,
                                   triton_available, triton_device)

interpret_where_no_gpu()  # before anything imports triton.language (torch._dynamo does): see _triton_env

from lowerings.counters import KernelCounter, counted, record, record_compile  # noqa: E402
from lowerings.limits import Limits  # noqa: E402
from lowerings.protocol import BASE_2, BASE_E, NO_LSE, Lowering, LoweringResult, Partial  # noqa: E402
from lowerings.registry import all_lowerings, get, load_plugin, names, register, unregister  # noqa: E402

__all__ = [
    "BASE_2", "BASE_E", "NO_LSE", "KernelCounter", "Limits", "Lowering", "LoweringResult", "Partial", "all_lowerings",
    "counted", "ensure_interpreter_on_cpu", "get", "interpret_where_no_gpu", "interpreting", "kernel_is_interpreted",
    "kernel_param_is_constexpr", "kernel_param_not_specialized", "load_plugin", "names", "record", "record_compile",
    "register", "triton_available", "triton_device", "unregister",
]
