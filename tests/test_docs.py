"""The documentation is true: its examples run and print what the page shows, the
README's commands are the ones CI runs, and the demo the README advertises passes.

Every ```python block of README.md, docs/*.md and benchmarks/README.md runs, each
file's blocks in order in one namespace (so a page reads as one session). A block
preceded by `<!-- skip-test: reason -->` is skipped; the reason is required.
A ```text block right after a python block is what the page says that code prints:
it must equal what the block prints, except for pass timings ("took 0.05
milliseconds"). When a change to thunderfn changes that output (a new
decomposition, say), rerun with EXPECTTEST_ACCEPT=1 to rewrite the shown output
from what the code now prints, then read the diff.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import hypothesis
import pytest
import torch

from thunderfn.testing.registries import RegistrySnapshot

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"])
REQUIRED_DOCS = ("README.md", "docs/index.md", "docs/traces.md", "docs/jit.md", "docs/errors.md")
ACCEPT = os.environ.get("EXPECTTEST_ACCEPT", "") not in ("", "0")  # expecttest's convention

_FENCE = re.compile(r"^```(\w*)\s*$")
_SKIP = re.compile(r"^<!--\s*skip-test:(.*?)-->\s*$")
_TIMING = re.compile(r"took [0-9.]+ milliseconds")


class CodeBlock:
    """A fenced block: its body spans lines first..last (0-based, fences excluded)."""

    def __init__(self, path: Path, first: int, last: int, language: str, source: str, skip_reason: str | None):
        self.path, self.first, self.last = path, first, last
        self.language, self.source, self.skip_reason = language, source, skip_reason
        self.shown_output: CodeBlock | None = None  # the ```text block that follows a python block

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.first}"  # the opening fence's 1-based line

    def compiled(self):
        # Leading newlines make the code's line numbers the markdown file's.
        return compile("\n" * self.first + self.source, str(self.path), "exec")


def code_blocks(path: Path) -> list[CodeBlock]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = _SKIP.match(previous)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise AssertionError(f"{path.relative_to(ROOT)}:{i + 1}: code block is never closed")
        block = CodeBlock(path, i + 1, end - 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n",
                          skip.group(1).strip() if skip else None)
        if block.language == "text" and blocks and blocks[-1].language == "python" and previous == "```":
            blocks[-1].shown_output = block
        blocks.append(block)
        i = end + 1
    return blocks


def _normalized(output: str) -> str:
    return _TIMING.sub("took N milliseconds", output).strip()


def _rewrite_shown_outputs(path: Path, replacements: list[tuple[CodeBlock, str]]) -> None:
    lines = path.read_text().splitlines()
    for block, printed in sorted(replacements, key=lambda r: r[0].first, reverse=True):
        lines[block.first:block.last + 1] = printed.rstrip("\n").splitlines()
    path.write_text("\n".join(lines) + "\n")


def test_required_docs_exist():
    missing = [name for name in REQUIRED_DOCS if not (ROOT / name).is_file()]
    assert not missing, f"missing documentation files: {missing}"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run_and_print_what_is_shown(path: Path):
    if not path.is_file():
        pytest.skip(f"{path.relative_to(ROOT)} does not exist")
    namespace = {"__name__": f"docs_{path.stem}"}
    stale: list[tuple[CodeBlock, str]] = []
    default_dtype, grad_enabled = torch.get_default_dtype(), torch.is_grad_enabled()
    registries = RegistrySnapshot()  # executors, prims and torch symbols a page adds (docs/extending.md)
    try:
        for block in code_blocks(path):
            if block.language != "python" or block.skip_reason is not None:
                continue
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(block.compiled(), namespace)
            shown = block.shown_output
            if shown is not None and _normalized(shown.source) != _normalized(printed.getvalue()):
                stale.append((shown, printed.getvalue()))
    finally:  # an example that changes global torch state must not leak it into other tests
        torch.set_default_dtype(default_dtype)
        torch.set_grad_enabled(grad_enabled)
        registries.restore()
    if stale and ACCEPT:
        _rewrite_shown_outputs(path, stale)
    elif stale:
        shown, printed = stale[0]
        raise AssertionError(
            f"{shown.where}: the output shown is not what the example above it prints now "
            f"({len(stale)} stale block(s) in this file). If the change is intended, rerun with "
            f"EXPECTTEST_ACCEPT=1 to rewrite them. The example printed:\n{printed}")


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_skipped_examples_say_why(path: Path):
    if not path.is_file():
        pytest.skip(f"{path.relative_to(ROOT)} does not exist")
    unexplained = [b.where for b in code_blocks(path) if b.skip_reason == ""]
    assert not unexplained, f"skip-test markers without a reason: {unexplained}"


def _readme_commands() -> dict[str, str]:
    """The README's fresh-machine commands, keyed by their last step."""
    commands = {}
    for block in code_blocks(ROOT / "README.md"):
        text = block.source.strip()
        if block.language == "" and text.startswith("python3 -m venv"):
            commands[text.rsplit("&&", 1)[-1].strip()] = text
    return commands


def test_readme_has_demo_and_test_commands():
    commands = _readme_commands()
    assert "python -m thunderfn" in commands, "README.md lost its demo command"
    assert "python -m pytest -n 2 tests" in commands, "README.md lost its test command"
    for command in commands.values():
        assert "torch==2.13.0" in command, f"an unpinned torch would download gigabytes: {command}"


def test_every_documented_torch_install_is_pinned():
    # an unpinned `pip install torch` ignores a torch wheel already at hand and may reach for an index
    # the machine cannot reach; getting_started.md once said so while the README pinned it
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    # the packages a `pip install` names, up to a comment or the end of inline code
    installs = [(page.name, arguments.split()) for page in pages
                for arguments in re.findall(r"pip install ([^#`\n]*)", page.read_text())]
    unpinned = [f"{name}: pip install {' '.join(words)}" for name, words in installs
                if any(re.fullmatch(r"torch([<>~!].*)?", word) for word in words)]
    assert not unpinned, unpinned


def test_the_readme_test_command_draws_the_same_property_examples_on_every_run():
    # without HYPOTHESIS_PROFILE the derandomized profile is loaded (tests/conftest.py), so the command
    # is green or red alike on every run; HYPOTHESIS_PROFILE=dev explores with fresh examples
    if "HYPOTHESIS_PROFILE" in os.environ:
        pytest.skip(f"HYPOTHESIS_PROFILE={os.environ['HYPOTHESIS_PROFILE']} chose the profile")
    assert hypothesis.settings.default.derandomize
    assert "HYPOTHESIS_PROFILE=dev" in (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    readme_steps = [step.strip() for step in _readme_commands()["python -m pytest -n 2 tests"].split("&&")]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]

    def words_of(step: str) -> list[str]:
        words = [w for w in shlex.split(step) if w not in ("--quiet", "-q")]
        return ["."] + words[1:] if words[:1] == ["source"] else words  # `source` and `.` are one command

    ci_steps = [words_of(line) for line in ci_lines]
    for step in readme_steps:
        words = words_of(step)
        # CI may set environment variables (HYPOTHESIS_PROFILE=ci) in front of a step.
        assert any(ci[-len(words):] == words and all("=" in w for w in ci[:-len(words)]) for ci in ci_steps), \
            f".ci/run does not run the README's step `{step}`"


def test_readme_demo_passes():
    from thunderfn.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["--calls", "3"])
    assert status == 0 and "PASS" in printed.getvalue(), printed.getvalue()
    assert "x eager's time, lower is faster)" in printed.getvalue()  # a bare "0.84x eager" reads either way


def test_training_demo_follows_eager_and_prints_each_step():
    from thunderfn.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["--model", "gpt-tiny", "--steps", "3"])
    out = printed.getvalue()
    assert status == 0 and "PASS" in out, out
    steps = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in steps] == ["0", "1", "2"]
    assert float(steps[2][1]) < float(steps[0][1])  # the loss goes down
