"""The process machinery: isolated workers and their fork server, `--jobs` children and their prefork, GPUs and
MPS, signals, the hook watchdog, device-memory leases, shared compile caches, JIT warm-up and precompile.

It implements the engine's ports (`parity.engine.ports`) and imports the engine, never the front ends.
"""
