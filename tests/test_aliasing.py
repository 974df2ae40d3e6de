"""Aliasing under jit equals eager: an output shares storage with an input iff eager's
does (views are views, copies are copies, layout-dependent ops decide at run time as
torch does), and the checks eager makes on layouts raise under jit too."""
from __future__ import annotations

import zlib

import pytest
import torch

import thunderfn as tf
from thunderfn.testing.aliasing import alias_mismatches
from thunderfn.testing.opinfos import op_db

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning",
                                        "ignore:Implicit dimension choice for:UserWarning")


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.mark.parametrize("op", [pytest.param(op, id=op.name) for op in op_db])
def test_output_shares_storage_with_input_iff_eager_does(op):
    jitted = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs))
    problems = []
    for dtype in op.dtypes[:2]:  # aliasing depends on dtype only through conversions: float and one more
        problems += alias_mismatches(op, dtype, jitted)
    assert not problems, "\n".join(problems)
