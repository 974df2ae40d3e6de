"""Test support, above the api: the OpInfo database (opinfos/), hypothesis strategies,
and checks shared by the test suite and the coverage benchmarks. May import anything.
"""
