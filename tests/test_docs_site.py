"""The documentation site: it builds strictly (a broken link, anchor or reference fails), and
every public name of the API has a reference entry whose docstring carries an example that runs."""
import doctest
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import thunderfn as tf

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"

# The public API (shared API's names), each as the reference pages name it.
PUBLIC = [
    "thunderfn.jit", "thunderfn.grad", "thunderfn.value_and_grad", "thunderfn.vjp", "thunderfn.jvp", "thunderfn.vmap",
    "thunderfn.jacrev", "thunderfn.jacfwd", "thunderfn.hessian", "thunderfn.custom_vjp", "thunderfn.custom_jvp",
    "thunderfn.executor_lower", "thunderfn.cache_info", "thunderfn.mark_dynamic", "thunderfn.mark_static",
    "thunderfn.trace", "thunderfn.last_traces", "thunderfn.last_backward_traces", "thunderfn.Trace",
    "thunderfn.BoundSymbol", "thunderfn.Symbol", "thunderfn.TensorProxy", "thunderfn.prims.make_prim",
    "thunderfn.torch.torchsymbol", "thunderfn.executors.OperatorExecutor", "thunderfn.executors.FusionExecutor",
    "thunderfn.executors.register_executor", "thunderfn.executors.get_executor",
    "thunderfn.executors.get_default_executors", "thunderfn.executors.set_default_executors",
    "thunderfn.executors.add_operator_executor", "thunderfn.executors.available", "thunderfn.distributed.ddp",
    "thunderfn.distributed.fsdp", "thunderfn.distributed.full_parameters", "thunderfn.dynamo.backend",
    "thunderfn.dynamo.explain", "thunderfn.debug.print", "thunderfn.debug.breakpoint", "thunderfn.visualize",
    "thunderfn.profile", "thunderfn.testing.check_grads", "thunderfn.examine", "thunderfn.functional_call",
    "thunderfn.register_pytree_node", "thunderfn.cond", "thunderfn.scan", "thunderfn.while_loop",
    "thunderfn.fori_loop", "thunderfn.extend.primitive", "thunderfn.checkpoint", "thunderfn.checkpoint_name",
    "thunderfn.checkpoint_policies", "thunderfn.eval_shape", "thunderfn.linearize",
    "thunderfn.stack_module_state",
]


def _referenced() -> set:
    return {m for page in REFERENCE.glob("*.md") for m in re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M)}


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_public_name_has_a_reference_entry():
    missing = sorted(set(PUBLIC) - _referenced())
    assert not missing, f"public names without an entry in docs/reference/: {missing}"


@pytest.mark.parametrize("dotted", PUBLIC)
def test_every_public_name_has_a_docstring_with_an_example_that_runs(dotted, tmp_path, monkeypatch):
    obj = _resolve(dotted)
    doc = obj.__doc__ or ""
    assert ">>>" in doc, f"{dotted}'s docstring has no example"
    monkeypatch.chdir(tmp_path)  # an example may write a file
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(obj, dotted, globs={"tf": tf, "__builtins__": __builtins__}):
        # clear_globs=False: Dynamo keeps names in an example's globals and removes them itself later
        result = runner.run(test, out=lambda text: pytest.fail(text), clear_globs=False)
        assert result.attempted > 0


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,  # run as `python -m mkdocs`, from this Python
                    reason="mkdocs is not installed (pip install -e '.[docs]', part of the test extra)")
def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "reference" / "transforms" / "index.html").exists()
