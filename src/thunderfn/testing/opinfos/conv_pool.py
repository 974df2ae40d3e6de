"""OpInfos for thunderfn/torch/conv_pool.py's symbols: max pooling and adaptive max pooling, whose
forward computes the indices their backward reads (convolution and the other pools are opaque ops,
checked against eager in tests/test_conv_pool.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from thunderfn.testing.opinfo import OpInfo, SampleInput, make_tensor

DTYPES = (torch.float32, torch.float64)


def max_pool_samples(dims):
    def samples(device, dtype):
        spatial = (7,) * dims
        for batch in ((2, 3), (3,)):  # batched and unbatched
            x = make_tensor(batch + spatial, device=device, dtype=dtype)
            yield SampleInput((x, 3))
            yield SampleInput((x, 2), {"stride": 2, "padding": 1, "ceil_mode": True}, name="padding, ceil_mode")
            yield SampleInput((x, 3), {"dilation": 2, "return_indices": True}, name="dilation, indices")
    return samples


def adaptive_max_pool_samples(dims):
    def samples(device, dtype):
        x = make_tensor((2, 3) + (7,) * dims, device=device, dtype=dtype)
        yield SampleInput((x, 3))
        yield SampleInput((x, 1), {"return_indices": True}, name="global, indices")
    return samples


opinfos = [
    *(OpInfo(f"nn.functional.max_pool{d}d", getattr(F, f"max_pool{d}d"), max_pool_samples(d), DTYPES)
      for d in (1, 2, 3)),
    *(OpInfo(f"nn.functional.adaptive_max_pool{d}d", getattr(F, f"adaptive_max_pool{d}d"), adaptive_max_pool_samples(d),
             DTYPES) for d in (1, 2, 3)),
]
