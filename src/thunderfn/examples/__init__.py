"""Example programs shared by the demo (`python -m thunderfn`), the benchmarks and the tests."""
