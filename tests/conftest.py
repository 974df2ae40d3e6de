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


# -- import order --------------------------------------------------------------------------------
# `--torch-dynamo-first` imports torch._dynamo before any test module imports thunderfn, as a user's
# program does when a library (or torch.testing's internals) imported it first: Dynamo then wraps some
# of torch's functions (torch.manual_seed) before thunderfn sees them. tests/test_import_order.py runs
# the interception and randomness tests this way in a fresh interpreter.
def pytest_addoption(parser):
    parser.addoption("--torch-dynamo-first", action="store_true",
                     help="import torch._dynamo before thunderfn (checks that import order changes nothing)")


def pytest_configure(config):
    if config.getoption("--torch-dynamo-first"):
        import sys

        assert "thunderfn" not in sys.modules, "thunderfn was imported before torch._dynamo"
        import torch._dynamo  # noqa: F401  (the point: loaded before thunderfn)
