"""OpInfos for thunderfn.torch.shape."""
from thunderfn.testing.opinfo import ErrorInput, OpInfo, SampleInput, make_tensor  # noqa: F401

opinfos: list[OpInfo] = []
