"""The layers of the code import only downward (docs/architecture.md).

Read from the source with ast: every import statement of a thunderfn module, at module
level or inside a function, is an edge of the import graph. The graph has no cycle; every module imports only its own
layer or lower ones; and no thunderfn import hides inside a function (where a lower
layer needs an upper one at run time, the upper one hands itself down when imported:
core/context.py's register_jit and register_custom_vjp, core/interception.py's
set_dispatcher, core/symbol.py's set_eager_composite). A run in a fresh process checks what the source says: importing
a layer loads nothing above it, and `import thunderfn.prims` alone gives prims that
compute on tensors.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest

import thunderfn

PACKAGE_DIR = os.path.dirname(thunderfn.__file__)
SRC = os.path.dirname(PACKAGE_DIR)

# Lowest first. A module belongs to the first layer with a prefix it has (the prefix itself or a
# submodule of it); "thunderfn" alone is the package __init__.
LAYERS = [
    ("core", ("thunderfn.core", "thunderfn.errors")),
    ("prims", ("thunderfn.prims_eager", "thunderfn.prims_control_flow", "thunderfn.prims")),
    ("clang", ("thunderfn.clang",)),
    ("torch language", ("thunderfn.torch",)),
    ("transforms", ("thunderfn.transforms",)),
    ("executors", ("thunderfn.executors",)),
    ("api", ("thunderfn.jit", "thunderfn.jit_options", "thunderfn.compile_stages", "thunderfn.cache_entry",
             "thunderfn.cache_key", "thunderfn.cache_misses", "thunderfn.fast_path", "thunderfn.visualize",
             "thunderfn.profile", "thunderfn.debug", "thunderfn.dynamic_shapes", "thunderfn.module",
             "thunderfn.static_args", "thunderfn.donation", "thunderfn.blocks", "thunderfn.disk_cache",
             "thunderfn.stages", "thunderfn.examine", "thunderfn.extend",
             "thunderfn.distributed",
             "thunderfn.dynamo", "thunderfn")),
    # users of the api: the OpInfo database and test helpers, the demo and the example model it runs
    ("tools", ("thunderfn.testing", "thunderfn.examples", "thunderfn.__main__")),
]
# Pairs (importer, imported) forbidden although the imported layer is lower: executors know what
# transforms produce (traces of symbols), not transforms; transforms know executors only by what they
# answer (executor_lower's lowering_for, checker, lower, vjp).
FORBIDDEN = {("executors", "transforms")}

# Function-local imports of thunderfn modules that are allowed, each with why. None is needed today:
# an optional library (triton, apex) is imported lazily, but it is not a thunderfn module.
ALLOWED_LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    # (importing module, imported module): "why it cannot be at module level",
}


def _modules() -> dict:
    mods = {}
    for root, _, files in os.walk(PACKAGE_DIR):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                name = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported thunderfn module, line, inside a function) for each import statement in module
    (its source, unless given)."""
    path = MODULES[module]
    tree = ast.parse(open(path).read() if source is None else source, path)
    is_package = path.endswith("__init__.py")
    functions = [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    in_function = {id(node) for fn in functions for node in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            hit = _resolve(target) if target.split(".")[0] == "thunderfn" else None
            if hit is not None and hit != module:
                found.append((hit, node.lineno, id(node) in in_function))
    return found


IMPORTS = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p != "thunderfn" and module.startswith(p + ".")) for p in prefixes):
            return i
    raise LookupError(module)


def _cycle(edges: dict) -> list | None:
    """One cycle of the graph (a list of modules, the first repeated at the end), or None."""
    state: dict = {}  # module -> "open" while on the DFS path, "done" after
    path: list = []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_every_module_has_a_layer():
    unplaced = []
    for m in MODULES:
        try:
            _layer(m)
        except LookupError:
            unplaced.append(m)
    assert not unplaced, f"modules in no layer of LAYERS (place them): {unplaced}"


def test_the_import_graph_has_no_cycle():
    edges = {m: {target for target, _, _ in IMPORTS[m]} for m in MODULES}
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_imports_only_its_layer_or_lower_ones():
    wrong = []
    for m, imports in IMPORTS.items():
        for target, line, _ in imports:
            mine, theirs = _layer(m), _layer(target)
            if theirs > mine or (LAYERS[mine][0], LAYERS[theirs][0]) in FORBIDDEN:
                wrong.append(f"{MODULES[m]}:{line}: {m} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_thunderfn_import_hides_inside_a_function():
    hidden = [f"{MODULES[m]}:{line}: {m} imports {target} inside a function"
              for m, imports in IMPORTS.items() for target, line, local in imports
              if local and (m, target) not in ALLOWED_LOCAL_IMPORTS]
    assert not hidden, "function-local imports (move them to module level, or allow-list them with why):\n" + \
        "\n".join(hidden)


def test_the_checks_fail_on_a_bad_import(monkeypatch):
    """The checks can fail: executors/base.py importing custom_vjp inside a function (as it once
    did) is found, and is against the layers; core/trace.py importing jit makes a cycle too."""
    source = open(MODULES["thunderfn.executors.base"]).read() + (
        "\n\ndef _convert(vjp):\n    from thunderfn.transforms.custom_vjp import custom_vjp\n")
    found = _imports("thunderfn.executors.base", source)
    assert ("thunderfn.transforms.custom_vjp", source.count("\n"), True) in found
    monkeypatch.setitem(IMPORTS, "thunderfn.executors.base", found)
    with pytest.raises(AssertionError, match=r"executors.base \(executors\) imports thunderfn.transforms.custom_vjp"):
        test_every_module_imports_only_its_layer_or_lower_ones()
    with pytest.raises(AssertionError,
                       match="executors.base imports thunderfn.transforms.custom_vjp inside a function"):
        test_no_thunderfn_import_hides_inside_a_function()
    jit_at_top = ("thunderfn.jit", 1, False)
    monkeypatch.setitem(IMPORTS, "thunderfn.core.trace", IMPORTS["thunderfn.core.trace"] + [jit_at_top])
    with pytest.raises(AssertionError, match="import cycle: .*thunderfn.core.trace -> thunderfn.jit"):
        test_the_import_graph_has_no_cycle()


def test_importing_a_layer_loads_nothing_above_it_and_prims_compute_alone():
    """In a fresh process whose thunderfn package is a bare stand-in (its __init__, which imports
    everything, not run): import each layer's modules in turn, lowest first, and check what got
    loaded; right after the prims layer, call prims on tensors."""
    layers = [(name, sorted(m for m in MODULES if _layer(m) == i and m != "thunderfn"))
              for i, (name, _) in enumerate(LAYERS[:6])]
    script = textwrap.dedent(f"""
        import importlib, sys, types
        package = types.ModuleType("thunderfn")
        package.__path__ = [{PACKAGE_DIR!r}]
        sys.modules["thunderfn"] = package
        import torch
        allowed = set()
        for name, modules in {layers!r}:
            allowed |= set(modules)
            for m in modules:
                importlib.import_module(m)
            above = sorted(m for m in sys.modules if m.startswith("thunderfn.") and m not in allowed)
            assert not above, f"importing the {{name}} layer loaded {{above}}"
            if name == "prims":
                from thunderfn import prims
                x = torch.tensor([1.0, -2.0])
                assert prims.add(x, 1.0).tolist() == [2.0, -1.0]
                assert prims.sum(prims.abs(x), (0,)).item() == 3.0
                assert prims.reshape(x, (2, 1)).shape == (2, 1)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
