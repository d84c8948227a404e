"""The judge, the runner, the reports, the CLI and the pytest plugin of dflash-parity."""

__version__ = "0.1.0"
