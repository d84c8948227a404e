"""Hypothesis strategies that draw drafter-attention cases (specs, never tensors), and the profiles.

Public surface: `cases`, `Limits`, `limit_overrides` and `with_overrides` (the CLI's `--limit`),
`limits_for` and `check_cases` (what a check draws for a lowering on a device: its limits with the
device's production defaults, the strategy, the boundary cases run first), `boundary_cases`,
`batch_sizes`, `context_length`, `windows`, `build_case`, `MODELS` (the production rows), `PROFILES`,
`profile_settings`.
"""

from strategies._boundaries import Boundary, boundary_cases, declared_boundaries
from strategies._cases import (Limits, batch_sizes, build_case, cases, context_length, limit_overrides, windows,
                               with_overrides)
from strategies._determinism import seed_only_draws
from strategies._models import MODEL_NAMES, MODELS, ModelConfig
from strategies._plan import CheckCases, check_cases, limits_for
from strategies._profiles import PROFILES, Profile, profile_settings

__all__ = ["Boundary", "CheckCases", "Limits", "MODELS", "MODEL_NAMES", "ModelConfig", "PROFILES", "Profile", "batch_sizes",
           "boundary_cases", "build_case", "cases", "check_cases", "context_length", "declared_boundaries",
           "limit_overrides", "limits_for", "profile_settings", "seed_only_draws", "windows", "with_overrides"]
