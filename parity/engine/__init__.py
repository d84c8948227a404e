"""The engine: judging a case and sweeping a lowering over drawn cases, shrinking a failure.

Pure: it computes verdicts and reports from cases, tolerances and what a lowering returned; it starts no process,
sends no signal and takes no file lock (none of `os.fork`, `subprocess`, `signal`, `multiprocessing`, `fcntl`). What
it needs of processes and devices it asks through ports (`parity.engine.ports`), which the front ends wire.
Layers (docs/concepts.md): oracle < lowerings < strategies < engine < exec, report < front.
"""
