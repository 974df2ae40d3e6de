"""Where compiled artifacts go.

thunderfn's own artifact is Python: each compiled trace becomes a function whose source
is registered with `linecache`, so tracebacks and debuggers show the generated lines; it
lives in memory and dies with its cache entry. Fusion executors compile kernels:
Inductor into `TORCHINDUCTOR_CACHE_DIR` (by default a folder under the system's temp
directory), Triton into `TRITON_CACHE_DIR` (by default `~/.triton/cache`). Both are
reused across processes.

Naming a directory, with `tf.jit(fn, cache_dir=...)` or the environment variable
`THUNDERFN_CACHE_DIR`, puts them all in one place:

- `<dir>/thunderfn/`: the source of each compiled trace, one `.py` file per trace
  (written when compiled; tracebacks then point at these files);
- `<dir>/inductor/` and `<dir>/triton/`: the kernel caches, where the user has not set
  `TORCHINDUCTOR_CACHE_DIR` / `TRITON_CACHE_DIR` already. These are process-wide
  settings, made on the first compile that names a directory.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading

ENV = "THUNDERFN_CACHE_DIR"
_local = threading.local()
_numbers = itertools.count()


def directory() -> str | None:
    """The directory the compile running on this thread writes to, if any."""
    return getattr(_local, "directory", None) or os.environ.get(ENV) or None


@contextlib.contextmanager
def writing_to(path: str | os.PathLike | None):
    """Compiles on this thread inside the block write to `path` (None: as configured outside)."""
    if path is None:
        yield
        return
    before = getattr(_local, "directory", None)
    _local.directory = os.fspath(path)
    try:
        yield
    finally:
        _local.directory = before


def write_source(name: str, source: str) -> str | None:
    """Save a compiled trace's source; its path (the generated code's filename), or None when
    no directory is configured."""
    root = directory()
    if root is None:
        return None
    folder = os.path.join(root, "thunderfn")
    os.makedirs(folder, exist_ok=True)
    safe = re.sub(r"[^\w.-]", "_", name)
    path = os.path.join(folder, f"{safe}_{os.getpid()}_{next(_numbers)}.py")
    with open(path, "w") as f:
        f.write(source)
    return path


def point_kernel_caches() -> None:
    """Send Inductor's and Triton's caches under the configured directory (called before a fusion
    executor compiles; the user's own settings win)."""
    root = directory()
    if root is None:
        return
    for variable, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        os.environ.setdefault(variable, os.path.join(os.path.abspath(root), sub))
