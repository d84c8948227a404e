"""Hypothesis strategies that draw drafter-attention cases (specs, never tensors), and the profiles.

Public surface: `cases`, `Limits`, `limit_overrides` and `with_overrides` (the CLI's `--limit`),
`batch_sizes`, `context_length`, `windows`, `build_case`, `PROFILES`, `profile_settings`.
"""

from strategies._cases import (Limits, batch_sizes, build_case, cases, context_length, limit_overrides, windows,
                               with_overrides)
from strategies._profiles import PROFILES, Profile, profile_settings

__all__ = ["Limits", "PROFILES", "Profile", "batch_sizes", "build_case", "cases", "context_length",
           "limit_overrides", "profile_settings", "windows", "with_overrides"]
