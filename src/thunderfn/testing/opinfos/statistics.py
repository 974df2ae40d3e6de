"""OpInfos for thunderfn.torch.statistics."""
import torch

from thunderfn.testing.opinfo import ErrorInput, OpInfo, SampleInput, make_tensor

FLOATS = (torch.float32, torch.float64)


def cov_samples(device, dtype):
    def mk(*shape, **kw):
        return make_tensor(shape, device=device, dtype=dtype, **kw)

    aweights = make_tensor((5,), device=device, dtype=dtype, low=0.1, high=2)
    fweights = torch.tensor([1, 0, 2, 3, 1], device=device)
    yield SampleInput((mk(3, 5),), name="variables in rows")
    yield SampleInput((mk(5),), name="one variable: 0-dim result")
    yield SampleInput((mk(1, 5),), {"correction": 0}, name="one row")
    yield SampleInput((mk(3, 5, noncontiguous=True),), {"correction": 2})
    yield SampleInput((mk(3, 5),), {"aweights": aweights})
    yield SampleInput((mk(2, 5),), {"fweights": fweights, "aweights": aweights, "correction": 0})
    yield SampleInput((mk(2, 1),), name="fewer observations than the correction: inf/nan")


def cov_errors(device):
    x = make_tensor((3, 5), device=device)
    yield ErrorInput(SampleInput((make_tensor((2, 2, 2), device=device),)), RuntimeError,
                     r"cov\(\): expected input to have two or fewer dimensions")
    yield ErrorInput(SampleInput((x,), {"aweights": -torch.ones(5, device=device)}), RuntimeError,
                     r"cov\(\): aweights cannot be negative")
    yield ErrorInput(SampleInput((x,), {"fweights": torch.tensor([1, -1, 1, 1, 1], device=device)}), RuntimeError,
                     r"cov\(\): fweights cannot be negative")
    yield ErrorInput(SampleInput((x,), {"aweights": torch.ones(4, device=device)}), RuntimeError,
                     r"cov\(\): expected aweights to have the same number of elements as observations")


def corrcoef_samples(device, dtype):
    def mk(*shape, **kw):
        return make_tensor(shape, device=device, dtype=dtype, **kw)

    yield SampleInput((mk(3, 6),))
    yield SampleInput((mk(6),), name="one variable")
    yield SampleInput((mk(1, 4),))
    yield SampleInput((mk(4, 3, noncontiguous=True),))


opinfos: list[OpInfo] = [
    OpInfo("cov", torch.cov, cov_samples, FLOATS, cov_errors),
    OpInfo("corrcoef", torch.corrcoef, corrcoef_samples, FLOATS),
]
