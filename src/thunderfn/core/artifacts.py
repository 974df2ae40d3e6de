"""Where compiled artifacts go.

thunderfn's own artifact is Python: each compiled trace becomes a function whose source
is registered with `linecache`, so tracebacks and debuggers show the generated lines; it
lives in memory and dies with its cache entry. Fusion executors compile kernels:
Inductor into `TORCHINDUCTOR_CACHE_DIR` (by default a folder under the system's temp
directory), Triton into `TRITON_CACHE_DIR` (by default `~/.triton/cache`). Both are
reused across processes.

Naming a directory, with `tf.jit(fn, cache_dir=...)` or the environment variable
`THUNDERFN_CACHE_DIR`, puts them all in one place:

- `<dir>/thunderfn-XXXXXXXX/`: the source of each compiled trace, one `.py` file per trace
  (written when compiled; tracebacks then point at these files). The folder is private to
  this process (made by tempfile.mkdtemp, mode 0700, a random name), and each file is
  created new (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600) under a temporary name and renamed
  into place, so a name or a symlink planted in a shared directory is never written through.
- `<dir>/inductor/` and `<dir>/triton/`: the kernel caches, where the user has not set
  `TORCHINDUCTOR_CACHE_DIR` / `TRITON_CACHE_DIR` already. These are process-wide
  settings, made on the first compile that names a directory. Inductor and Triton load and
  run the code they find in their caches, so they are pointed there only when the directory
  is the user's own: owned by this user and not writable by group or others. Otherwise a
  warning says so and they keep their defaults.

A directory thunderfn cannot write to (read-only, or made so between calls) costs a warning,
once per directory: compiling goes on, the sources stay in memory.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
import tempfile
import threading
import warnings

ENV = "THUNDERFN_CACHE_DIR"
_local = threading.local()
_numbers = itertools.count()
_lock = threading.Lock()
_private: dict = {}  # cache dir -> this process's private folder in it
_unwritable: set = set()  # cache dirs a write failed in (warned once)
_not_own: set = set()  # cache dirs the kernel caches were not pointed into (warned once)


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


def _private_folder(root: str) -> str:
    """This process's folder in `root`: made once, by mkdtemp (mode 0700, an unguessable name)."""
    folder = _private.get(root)
    if folder is None or not os.path.isdir(folder):
        os.makedirs(root, mode=0o700, exist_ok=True)
        folder = _private[root] = tempfile.mkdtemp(prefix="thunderfn-", dir=root)
    return folder


def _write_new(path: str, text: str) -> None:
    """Write `text` to `path` without following or reusing anything already there: a new file
    under a temporary name (O_EXCL: never one that exists; O_NOFOLLOW: never through a
    symlink), then renamed into place, so readers see the whole file or none."""
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_source(name: str, source: str) -> str | None:
    """Save a compiled trace's source; its path (the generated code's filename), or None when
    no directory is configured or it cannot be written (warned once per directory)."""
    root = directory()
    if root is None or root in _unwritable:
        return None
    safe = re.sub(r"[^\w.-]", "_", name)
    try:
        with _lock:
            # the pid: a forked child shares the folder, and must not replace its parent's files
            path = os.path.join(_private_folder(root), f"{safe}_{os.getpid()}_{next(_numbers)}.py")
        _write_new(path, source)
    except OSError as e:  # read-only, full, or taken away: compiled code does not need the file
        _unwritable.add(root)
        warnings.warn(f"thunderfn: cannot write compiled sources to cache_dir {root!r} ({e}); going on without "
                      f"writing there (tracebacks show the generated code from memory). Give a directory you can "
                      f"write to, or leave cache_dir unset.", stacklevel=2)
        return None
    return path


def _is_own_directory(path: str) -> tuple[bool, str]:
    """(whether `path` is a directory only this user can write, why not)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return False, f"cannot inspect it ({e})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return False, "it is not a directory (or is a symlink)"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False, f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False, f"it is writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
    return True, ""


def point_kernel_caches() -> None:
    """Send Inductor's and Triton's caches under the configured directory (called before a fusion
    executor compiles; the user's own settings win), if it is the user's own: the kernel
    caches hold code Inductor and Triton load and run."""
    root = directory()
    if root is None or root in _not_own:
        return
    root = os.path.abspath(root)
    with contextlib.suppress(OSError):
        os.makedirs(root, mode=0o700, exist_ok=True)
    own, why = _is_own_directory(root)
    if not own:
        _not_own.add(directory())
        warnings.warn(f"thunderfn: not pointing Inductor's and Triton's kernel caches into cache_dir {root!r}: {why}. "
                      f"They load and run the code found there, so cache_dir must be a directory only you can write "
                      f"(chmod 700). They keep their default locations.", stacklevel=2)
        return
    try:  # Inductor and Triton fail on a cache they cannot write: leave them their defaults then
        for sub in ("inductor", "triton"):
            os.makedirs(os.path.join(root, sub), mode=0o700, exist_ok=True)
    except OSError as e:
        _not_own.add(directory())
        warnings.warn(f"thunderfn: cannot write to cache_dir {root!r} ({e}); Inductor's and Triton's kernel caches "
                      f"keep their default locations.", stacklevel=2)
        return
    for variable, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        os.environ.setdefault(variable, os.path.join(root, sub))
