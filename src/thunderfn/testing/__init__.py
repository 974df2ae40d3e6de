"""Test support, above the api: the OpInfo database (opinfos/), hypothesis strategies,
and checks shared by the test suite and the coverage benchmarks. May import anything.

`tf.testing` is loaded when first asked for (`import thunderfn` does not import it): it sits above
the api. The strategies need hypothesis (the test extra): import thunderfn.testing.strategies.
"""
from thunderfn.testing.numerical import check_grads  # noqa: F401  (tf.testing.check_grads)
