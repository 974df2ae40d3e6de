"""Importing the model libraries the benchmarks and tests use where they are installed (transformers,
timm, torchvision, litgpt), and saying why not where they cannot be.

One environment needs help: torchvision 0.28 from a registry that only has its CUDA build, beside a
CPU torch. Its compiled extension does not load, and its Python side then fails at import
(`operator torchvision::nms does not exist`, registering fakes for ops the extension would have
defined), which also breaks transformers, timm and litgpt, since they import torchvision when it is
installed. Declaring those two schemas first lets torchvision's pure-torch models import; its
detection ops stay unavailable.
"""
from __future__ import annotations

import importlib
import sys

import torch

_declared = []  # the Library object that declares the schemas must stay alive


def import_torchvision():
    """torchvision, made importable as above where its extension is missing; None where it is not installed."""
    try:
        return importlib.import_module("torchvision")
    except ImportError:
        return None
    except RuntimeError:
        if not _declared:
            library = torch.library.Library("torchvision", "DEF")
            library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _declared.append(library)
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        return importlib.import_module("torchvision")


def why_unavailable(library: str) -> str | None:
    """None when `library` imports (torchvision made importable first), else why it does not."""
    try:
        import_torchvision()
        importlib.import_module(library)
    except Exception as e:  # an optional library: any failure to import means what needs it is skipped
        return f"{library} is not importable ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    return None
