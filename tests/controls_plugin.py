"""A plugin file (`--plugin tests/controls_plugin.py`) registering the controls of `tests/controls.py`: correct
lowerings in three computation orders, for `dflash-parity check` on a GPU (the record that no correct order fails)."""

from lowerings import register
from tests.controls import controls

for _c in controls():
    register(_c)
