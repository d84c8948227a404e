"""Where Triton kernels of this package run: compiled on a GPU, or under Triton's interpreter on CPU.

Triton decides *when a kernel is decorated* (``@triton.jit``) whether it becomes a compiled
``JITFunction`` or an interpreted ``InterpretedFunction``:

- triton >= 3.4: ``triton.knobs.runtime.interpret``, an ``env_bool``
  knob that reads the environment variable ``TRITON_INTERPRET`` each time it is asked (unless code set
  the knob explicitly), and ``triton.jit`` asks it at decoration time;
- older triton: ``os.environ.get("TRITON_INTERPRET", "0") == "1"`` read inside ``triton.jit``.

So the variable has to be set before the kernel modules are imported. :func:`ensure_interpreter_on_cpu`
does that on machines without CUDA (where a compiled kernel could never run anyway) and leaves an
explicit setting alone. :func:`interpreting` reports the mode in both triton generations, and
:func:`kernel_is_interpreted` tells, for an already decorated kernel, which one it actually became
(the launchers use it to set their ``UPCAST`` switch: bf16 arithmetic and ``tl.dot`` on bf16 are not
emulated faithfully by the interpreter, so interpreted kernels upcast loaded tiles to fp32).
"""

from __future__ import annotations

import os

_TRUE = ("1", "true", "on", "yes")


def _env_flag() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def interpreting() -> bool:
    """True when Triton kernels decorated now would run under the interpreter.

    Reads ``triton.knobs.runtime.interpret`` when triton has knobs (>= 3.4; it follows the environment
    variable ``TRITON_INTERPRET`` unless set explicitly), else the variable itself ("1"/"true"/"on"/"yes",
    case-insensitive). Does not import triton if it is not importable.
    """
    try:
        from triton import knobs  # type: ignore[attr-defined]

        return bool(knobs.runtime.interpret)
    except Exception:  # triton missing, or a version without knobs
        return _env_flag()


def ensure_interpreter_on_cpu() -> bool:
    """Turn Triton's interpreter on when no CUDA device exists and nobody chose a mode.

    Sets ``os.environ["TRITON_INTERPRET"] = "1"`` if ``torch.cuda.is_available()`` is False and the
    variable is unset. It must run before the kernels are decorated (the kernel modules of this
    package call it at import). An explicit ``TRITON_INTERPRET`` (any value) is never overridden.
    Returns :func:`interpreting` afterwards.
    """
    if "TRITON_INTERPRET" not in os.environ:
        try:
            import torch

            has_cuda = bool(torch.cuda.is_available())
        except Exception:
            has_cuda = False
        if not has_cuda:
            os.environ["TRITON_INTERPRET"] = "1"
    return interpreting()


def no_gpu_here() -> bool:
    """True where this process can have no CUDA device, decided without initializing CUDA (a process that
    forks others, `parity.exec.prefork`, must not): no CUDA driver library to load, or `CUDA_VISIBLE_DEVICES`
    hiding every device ("" or "-1"). False means there may be one (`ensure_interpreter_on_cpu` asks torch)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return True
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


def interpret_where_no_gpu() -> None:
    """Set ``TRITON_INTERPRET=1`` (where unset) now if `no_gpu_here()`, before anything imports
    ``triton.language``: ``torch._dynamo`` does (a `torch.compile`'d merge, the prefork's preload), and Triton's
    standard-library helpers (``tl.zeros``, ...) decorated then stay compiled-mode functions that an
    interpreted kernel cannot call ("Cannot call @triton.jit'd outside of the scope of a kernel": every case of
    hybrid_paged failed after windowed_merge[compiled] in one CPU process, and in `check --jobs --no-isolate`
    children on CPU). Runs when the `lowerings` package is imported; touches neither torch nor CUDA."""
    if "TRITON_INTERPRET" not in os.environ and no_gpu_here():
        os.environ["TRITON_INTERPRET"] = "1"


def helpers_interpreted() -> bool:
    """Whether Triton's standard-library helpers (``tl.zeros``) can be called from an interpreted kernel:
    False where ``triton.language`` was imported before ``TRITON_INTERPRET`` was set, so they were decorated
    as compiled-mode functions. True where they are interpreted, or are not jit functions at all."""
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except Exception:
        return True
    helper = getattr(tl, "zeros", None)
    return not (isinstance(helper, JITFunction) and not isinstance(helper, InterpretedFunction))


def kernel_is_interpreted(kernel) -> bool:
    """True when ``kernel`` (a decorated Triton function) is an interpreted one.

    Looks at the object Triton built at decoration time (``InterpretedFunction`` vs ``JITFunction``),
    which is what actually runs, whatever the environment says now.
    """
    try:
        from triton.runtime.interpreter import InterpretedFunction

        return isinstance(kernel, InterpretedFunction)
    except Exception:
        return type(kernel).__name__ == "InterpretedFunction" or interpreting()


def triton_available(device: str | None = None) -> tuple[bool, str]:
    """``(True, "triton <version>")`` when ``import triton`` works (and, given ``device``, this
    process's Triton kernels can run there), else ``(False, reason)``.

    Decides the interpreter first: triton imported (``triton.language`` above all) before
    ``TRITON_INTERPRET`` is set leaves later interpreted kernels unable to call their ``@triton.jit``
    helpers ("Cannot call @triton.jit'd outside of the scope of a kernel"; seen with triton 3.9).
    On a GPU machine the kernels are compiled for the GPU: CPU tensors cannot reach them, so
    ``device="cpu"`` is unavailable there (with the way out in the reason), never a failed case.
    """
    ensure_interpreter_on_cpu()
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising something else
        return False, f"triton is not importable: {type(exc).__name__}: {exc}"
    if device == "cpu" and not interpreting():
        return False, ("the Triton kernels are compiled for the GPU in this process (TRITON_INTERPRET is "
                       "off): check on cuda, or set TRITON_INTERPRET=1 to interpret them on the CPU")
    if device == "cpu" and not helpers_interpreted():
        return False, ("triton.language was imported in this process before TRITON_INTERPRET was set (by "
                       "torch._dynamo or your own code), so interpreted kernels cannot call its helpers: set "
                       "TRITON_INTERPRET=1 before the process starts")
    return True, f"triton {getattr(triton, '__version__', '?')}"


def triton_device() -> str:
    """Where this process's Triton kernels take their tensors: ``"cpu"`` under the interpreter, else
    ``"cuda"`` (the tests of the kernels use it to run on a GPU runner as on CI)."""
    ensure_interpreter_on_cpu()
    return "cpu" if interpreting() else "cuda"


def kernel_param_is_constexpr(kernel, name: str) -> bool:
    """Whether the parameter ``name`` of a decorated Triton kernel is a ``tl.constexpr``.

    Works for compiled ``JITFunction`` (``kernel.params[i].is_constexpr``) and for interpreted kernels
    (the annotation of the wrapped Python function). Raises KeyError for an unknown parameter.
    """
    params = getattr(kernel, "params", None)
    if params is not None:
        for p in params:
            if p.name == name:
                return bool(p.is_constexpr)
        raise KeyError(name)
    import inspect

    import triton.language as tl

    fn = getattr(kernel, "fn", kernel)
    sig = inspect.signature(fn)
    if name not in sig.parameters:
        raise KeyError(name)
    ann = sig.parameters[name].annotation
    return ann is tl.constexpr or ann == "tl.constexpr" or (isinstance(ann, str) and ann.endswith("constexpr"))


def kernel_param_not_specialized(kernel, name: str) -> bool:
    """Whether integer parameter ``name`` is in the kernel's ``do_not_specialize`` list.

    Triton specializes integer arguments on ``== 1`` and on divisibility by 16, which would compile a
    variant per such value class; a parameter listed here never triggers a compile of its own.
    """
    for p in getattr(kernel, "params", None) or ():
        if p.name == name:
            return bool(p.do_not_specialize)
    dns = getattr(kernel, "do_not_specialize", None)
    if dns is None:  # interpreted kernel: the decoration kwargs are kept
        dns = getattr(kernel, "kwargs", {}).get("do_not_specialize", ()) or ()
    arg_names = getattr(kernel, "arg_names", None) or []
    for item in dns:
        if item == name:
            return True
        if isinstance(item, int) and item < len(arg_names) and arg_names[item] == name:
            return True
    return False
