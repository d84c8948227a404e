"""A plugin file (`--plugin tests/hardening_plugin.py`) that registers the hardening mutants; isolated workers
load it to find them by name."""

from tests.hardening_mutants import register_all

register_all()
