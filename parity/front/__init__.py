"""The front ends: `dflash-parity` (cli), the check session both front ends run, their options and configuration,
and the pytest plugin. The only layer that wires the process machinery into the engine.
"""
