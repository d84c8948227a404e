"""Hypothesis strategies that draw drafter-attention cases (specs, never tensors), and the profiles.

Public surface: `cases`, `Limits`, `limit_overrides` and `with_overrides` (the CLI's `--limit`; `Limits` and these
live in `lowerings.limits`, where a lowering's `case_limits` hook finds them), `limits_for` and `check_cases` (what a
check draws for a lowering on a device: its limits with the device's production defaults, the strategy, the boundary
cases run first), `boundary_cases`, `batch_sizes`, `context_length`, `windows`, `build_case`, `MODELS` (the production
rows, `lowerings.models`), `PROFILES`, `profile_settings`, and `seed_only_draws` (draws from the seed alone, whatever
modules the process imported).
"""

from lowerings.limits import Limits, limit_overrides, with_overrides
from lowerings.models import MODEL_NAMES, MODELS, ModelConfig
from strategies._boundaries import Boundary, boundary_cases, declared_boundaries
from strategies._cases import build_case, cases
from strategies._determinism import seed_only_draws
from strategies._fields import batch_sizes, context_length, windows
from strategies._plan import CheckCases, check_cases, limits_for
from strategies._profiles import PROFILES, Profile, profile_settings

__all__ = ["Boundary", "CheckCases", "Limits", "MODELS", "MODEL_NAMES", "ModelConfig", "PROFILES", "Profile", "batch_sizes",
           "boundary_cases", "build_case", "cases", "check_cases", "context_length", "declared_boundaries",
           "limit_overrides", "limits_for", "profile_settings", "seed_only_draws", "windows", "with_overrides"]
