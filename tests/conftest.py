"""Shared test configuration. Hypothesis profiles: `ci` is derandomized (the same
examples on every run, so CI is reproducible); `dev` explores with fresh seeds.
Select with HYPOTHESIS_PROFILE=ci|dev (default dev)."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
