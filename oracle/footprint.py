"""How much memory a case takes on its device, estimated from its spec (no tensor is built).

`run_case` holds the case's input tensors (`input_bytes`: q, both pools, the dense block, the page
table, the guarded output buffers) several times over: the inputs (which the yardstick reads in
place), the snapshot the untouched-input check compares against, the other-canary inputs of the
determinism re-run (and a third and fourth set when two runs differ), the isolation run's perturbed
inputs. On top of them: the
oracle's working set (`oracle_bytes`), the yardstick's (`yardstick_bytes`) and the lowering's own
(`LOWERING_COPIES` input sets, a guess: kernels allocate workspaces, torch glue allocates
temporaries). `run_bytes` adds it up; `strategies` keeps each drawn case under `Limits.max_case_bytes`
with it, and `parity.engine.runner` compares the parts against the device's memory before each step, skipping
(and saying so) what would not fit. All figures in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from oracle.case import BatchShape, Case

_SIZE = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int32": 4, "int64": 8, "float32": 4}
HARDENED_INPUT_SETS = 5  # inputs, the untouched-input snapshot, the other canary, a third and a fourth run
PLAIN_INPUT_SETS = 1  # the inputs (the `sdpa` yardstick reads them in place: parity.engine.case_run.run_yardstick)
LOWERING_COPIES = 1
ORACLE_CHUNK = 2048  # oracle.reference.DEFAULT_CHUNK (not imported: this module imports no torch)
SDPA_BATCH_KEYS = 1 << 13  # lowerings.torch_emulation.SDPA_BATCH_KEYS (the same reason)
GIB = 1 << 30


@dataclass(frozen=True)
class CaseShape(BatchShape):
    """What the estimates read of a case, without its page lists (the strategies size a draw before
    building it). A `Case` has the same attributes, so every function here takes either."""

    context_lens: tuple[int, ...]
    block_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    max_pages_per_request: int
    dtype: str
    kv_dtype: str
    page_table_dtype: str = "int32"
    page_table_pad: int = 0


Shape = Union[Case, CaseShape]


def pool_elements(case: Shape) -> int:
    """Elements of one pool (`num_pages * page_size * Hkv * D`): past 2**31 needs 64-bit offsets."""
    return case.num_pages * case.page_size * case.num_kv_heads * case.head_dim


def input_bytes(case: Shape) -> int:
    """One set of a case's tensors: q, both pools, the dense block, the page table, the output buffers."""
    c = case
    dt, kv = _SIZE[c.dtype], _SIZE[c.kv_dtype]
    q = c.batch_size * c.block_size * c.num_q_heads * c.head_dim * dt
    block = 2 * c.batch_size * c.block_size * c.num_kv_heads * c.head_dim * dt
    table = c.batch_size * (max(1, c.max_pages_per_request) + c.page_table_pad) * _SIZE[c.page_table_dtype]
    outputs = 3 * (q + c.batch_size * c.block_size * c.num_q_heads * 4)  # guarded out and lse_out
    return q + 2 * pool_elements(c) * kv + block + table + outputs


def oracle_bytes(case: Shape) -> int:
    """The oracle's working set: the torch engine's chunk of `ORACLE_CHUNK` keys for every request (K/V
    in fp32, scores, probabilities, masks) and its accumulators; the Triton engine needs less."""
    c = case
    chunk = min(ORACLE_CHUNK, c.max_keys)
    kv = 2 * c.batch_size * chunk * c.num_kv_heads * c.head_dim * 4
    scores = 4 * c.batch_size * c.num_q_heads * c.block_size * chunk * 4
    acc = 3 * c.batch_size * c.num_q_heads * c.block_size * (c.head_dim + 2) * 4
    return kv + scores + acc


def yardstick_bytes(case: Shape) -> int:
    """The `sdpa` yardstick's working set: one batch of requests (`lowerings.torch_emulation.sdpa_batches`:
    at most `max(SDPA_BATCH_KEYS, the longest L+K)` padded keys in all), one KV head's query group at a time
    past `lowerings.torch_emulation.SDPA_GROUPED_ELEMENTS`."""
    c = case
    T = max(c.max_keys, SDPA_BATCH_KEYS)
    dt = _SIZE[c.dtype]
    gathered = 4 * T * c.num_kv_heads * c.head_dim * dt  # context K/V read from the pool, then with the block
    per_group = c.group_size * T * (2 * c.head_dim * (dt + 4) + 3 * c.block_size * 4)
    return gathered + per_group


def working_dtype_bytes(case: Shape) -> int:
    """The default yardstick's working set (`parity.engine.yardstick.WorkingDtype`): one pass of the oracle's engine
    (`oracle_bytes`), its fp32 output and LSE, and its output in the working dtype."""
    c = case
    rows = c.batch_size * c.block_size * c.num_q_heads
    return rows * c.head_dim * _SIZE[c.dtype] + oracle_bytes(c) + rows * (c.head_dim + 1) * 4


def run_bytes(case: Shape, *, hardening: bool = True, profiled: bool = False) -> int:
    """The most `run_case` held at once for `case` (see the module docstring); `profiled`: its kernel names
    are read (the judged call is profiled: no copy of the inputs). The strategies' budget for a drawn case
    (`Limits.max_case_bytes`): it stays as it is, or the drawn cases change."""
    sets = HARDENED_INPUT_SETS if hardening else PLAIN_INPUT_SETS + (1 if profiled else 0)
    return _with_sets(case, sets)


HELD_INPUT_SETS = 3  # with hardening, the most input sets run_case holds at once: the inputs, the untouched-input
# snapshot, and one re-run's (the canary re-run's inputs are released before a third or fourth run, or the
# isolation run, takes its own: parity.engine.hardening.rerun_failures)


def lease_bytes(case: Shape, *, hardening: bool = True) -> int:
    """What a large case leases from the other processes on a shared GPU (`parity.exec.memory.device_lease`):
    `run_bytes`' parts with the input sets held at once (`HELD_INPUT_SETS`) instead of every set a case makes.
    Hardened production-scale cases peaked at about half of `run_bytes`, where leasing all of it kept a `--jobs 16`
    run waiting for leases most of its time (docs/gpu/2026-12-03-h200-session16.md). A case that needs more anyway
    runs out of memory and is judged again alone (`parity.engine.case_run`). A case whose kernel names are read
    leases nothing more: it profiles its judged call, on no copy."""
    sets = HELD_INPUT_SETS if hardening else PLAIN_INPUT_SETS
    return _with_sets(case, sets)


def _with_sets(case: Shape, sets: int) -> int:
    # `yardstick_bytes` (the `sdpa` yardstick's, at least the default's `working_dtype_bytes`): the estimate the
    # strategies draw under, kept so that the drawn cases stay the same.
    return (sets + LOWERING_COPIES) * input_bytes(case) + oracle_bytes(case) + yardstick_bytes(case)


CPU_CASE_BYTES = 256 << 20
CUDA_SHARE = 0.4  # of the GPU's memory, for one case (the rest: other processes, caches, fragmentation)


def device_case_bytes(device: str, share: float = CUDA_SHARE) -> int:
    """The default per-case budget on `device`: `share` of the GPU's memory on CUDA, `CPU_CASE_BYTES`
    on a CPU (small cases keep CPU runs fast)."""
    if str(device).split(":")[0] == "cuda":
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory * share)
        return 16 * GIB
    return CPU_CASE_BYTES


def human(n: int | float) -> str:
    """`1.5 GiB`, `300 MiB`, `12 KiB`: a byte count as a reader wants it."""
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
