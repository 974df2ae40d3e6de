"""Shared test configuration. Hypothesis profiles: `ci` (the default) is derandomized, the same
examples on every run, so `python -m pytest tests` is green or red the same way every time; `dev`
explores with fresh random examples on each run (HYPOTHESIS_PROFILE=dev, and --hypothesis-seed=N to
replay one run) to find new edge cases, which then become fixed regression tests."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
