"""Import order changes nothing: with torch._dynamo imported before thunderfn (torch.testing's
internals and many libraries do it), Dynamo has already wrapped some of torch's functions
(torch.manual_seed) when thunderfn registers its handlers and recorders. Each check runs in a
fresh interpreter, where the order can still be chosen; there, too, importing thunderfn alone does not
import torch._dynamo."""
import os
import subprocess
import sys

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
TESTS = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}

CHECKS = """
import torch
import torch.nn.functional as F
{first}
import thunderfn as tf
{last}

# seeding inside a traced function is recorded and replayed, not refused as a reseed
def seeded(x):
    torch.manual_seed(3)
    return x + torch.rand(3)
jf = tf.jit(seeded)
torch.manual_seed(3)
expected = torch.zeros(3) + torch.rand(3)
for _ in range(2):
    torch.testing.assert_close(jf(torch.zeros(3)), expected)
    torch.rand(5)  # the compiled function reseeds on every call

# every gradient of F.l1_loss arrives, through torch.autograd and tf.grad
a = torch.tensor([1., 2., 3.], requires_grad=True)
b = torch.tensor([3., 1., 1.], requires_grad=True)
tf.jit(lambda a, b: F.l1_loss(a, b))(a, b).backward()
expected = torch.tensor([-1., 1., 1.]) / 3
torch.testing.assert_close(a.grad, expected)
torch.testing.assert_close(b.grad, -expected)
ga, gb = tf.grad(lambda a, b: F.l1_loss(a, b, weight=b), argnums=(0, 1))(a.detach(), b.detach())
torch.testing.assert_close(ga, torch.tensor([-3., 1., 1.]) / 5)

# under torch.compile, torch.compiler.is_compiling() (which thunderfn stands in front of) is still True, with
# no graph break: Hugging Face's is_tracing() asks it before anything it cannot trace on CPU
def branch(x):
    return x + 1 if torch.compiler.is_compiling() else x - 1
torch.testing.assert_close(torch.compile(branch, backend="eager", fullgraph=True)(torch.zeros(2)), torch.ones(2))

# torch.manual_seed is still Dynamo-disabled and still a TorchScript builtin
import torch.jit._builtins
assert torch.jit._builtins._find_builtin(torch.manual_seed) == "aten::manual_seed"
print("ok")
"""


@pytest.mark.parametrize("dynamo_first", [True, False], ids=["torch._dynamo first", "thunderfn first"])
def test_seeding_and_gradients_do_not_depend_on_import_order(dynamo_first):
    first, last = ("import torch._dynamo", "") if dynamo_first else ("", "import torch._dynamo")
    script = CHECKS.format(first=first, last=last)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_interception_and_random_tests_pass_with_torch_dynamo_imported_first():
    """The interception and randomness test files, again, in an interpreter where torch._dynamo
    was imported before thunderfn (tests/conftest.py's --torch-dynamo-first)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--torch-dynamo-first",
                           os.path.join(TESTS, "test_interception.py"), os.path.join(TESTS, "test_random.py")],
                          capture_output=True, text=True, env=ENV, cwd=os.path.dirname(TESTS), timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_importing_thunderfn_does_not_import_dynamo():
    code = "import sys, thunderfn; assert 'torch._dynamo' not in sys.modules, 'thunderfn imported torch._dynamo'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
