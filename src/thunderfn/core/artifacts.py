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
  this process (made by tempfile.mkdtemp, mode 0700, a random name; made anew should it
  stop being a folder of this user's alone), and each file is created new (O_CREAT | O_EXCL |
  O_NOFOLLOW, mode 0600) under a temporary name and renamed into place, so a name or a
  symlink planted in a shared directory is never written through. The code that runs is the
  source in memory: nothing is read back from these files.
- `<dir>/inductor/` and `<dir>/triton/`: the kernel caches, where the user has not set
  `TORCHINDUCTOR_CACHE_DIR` / `TRITON_CACHE_DIR` already. These are process-wide
  settings, made on the first compile that names a directory. Inductor and Triton load and
  run the code they find in their caches, so they are pointed there only when `<dir>` and
  everything under `<dir>/inductor` and `<dir>/triton` is the user's own: each folder and
  file owned by this process's effective user, and none a symlink or anything but a file or a
  folder; `<dir>` not writable by group or others, nor anything below it that they could reach
  (checked once per directory and process, before the first fusion compile; see
  `_first_unsafe`). Otherwise a warning names the first entry that is not, and why, and they
  keep their defaults. Folders thunderfn makes there (`<dir>`, its missing parents,
  `inductor/`, `triton/`) are made mode 0700, which puts what Inductor and Triton write
  below them out of others' reach whatever the umask. What one process leaves there passes
  the next process's check, so the kernel caches are reused across processes.

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
KERNEL_CACHES = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))  # variable, folder
_local = threading.local()
_numbers = itertools.count()
_lock = threading.Lock()
_private: dict = {}  # cache dir -> this process's private folder in it
_unwritable: set = set()  # cache dirs a write failed in (warned once)
_kernel_caches_decided: set = set()  # cache dirs point_kernel_caches has checked in this process (pointed or warned)


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


def _make_private_dirs(path: str) -> None:
    """Make the folder `path` and any missing parent, each mode 0700 (os.makedirs gives the parents
    the umask's mode, which may let the group write them)."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if parent != path and not os.path.lexists(parent):
        _make_private_dirs(parent)
    with contextlib.suppress(FileExistsError):  # there already (what it is, the callers check)
        os.mkdir(path, 0o700)


def _why_unsafe(path: str, reachable: bool = True) -> tuple[str | None, os.stat_result | None]:
    """(why the entry `path`, a symlink not followed, could hold what another user put there, or None
    when it is a file or folder of this user's that no one else can write; its lstat).

    `reachable`: whether others may enter every folder on the way to it. One they cannot reach
    may be writable by group or others (a umask of 002 leaves Inductor's files so), unless it is a
    file with a second name (a hard link) somewhere else."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be inspected ({e})", None
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink", st
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return "is neither a file nor a folder (a FIFO, socket or device)", st
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})", st
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (reachable or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1)):
        writers = " and ".join(who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                               if st.st_mode & bit)
        return f"is writable by {writers} (mode {stat.S_IMODE(st.st_mode):o})", st
    return None, st


def _opens_to_others(st: os.stat_result) -> bool:
    """Whether group or others may enter the folder (search permission: needed to reach anything in it)."""
    return bool(st.st_mode & (stat.S_IXGRP | stat.S_IXOTH))


def _first_unsafe(root: str, subfolders) -> tuple[str, str] | None:
    """(the first entry that could hold code another user put there, why), or None: checked are
    `root` itself, each `root/<subfolder>` and everything under them.

    The check runs once, when a process first points the kernel caches there; Inductor and Triton
    load from them later. What it covers across that gap, and what not:
    - Covered: nobody else can add, replace or change anything in the checked trees afterwards.
      That takes write permission on a folder in them or on a file, and a path to it through
      folders they may enter; each entry is this user's and writable by this user alone, or out
      of others' reach (below a folder of this user's that only this user may enter: `root`
      and the folders thunderfn makes are mode 0700), and not a file with a second name elsewhere.
      POSIX ACLs that let others in show in the group bits. This is why folders' owners and
      modes are checked as well as files'.
    - Not covered: the folders above `root`. Whoever can write to the folder holding `root` (one
      without the sticky bit /tmp has), or owns a folder above it, can rename `root` away after the
      check and put a folder of theirs in its place. Nor a file descriptor (or working directory)
      another user opened in here while it was open to them. Nor root.
    The cost is one lstat per entry, once per process and directory: about 0.1 s for 10,000 files.
    """
    pending = [(root, True)]  # (entry, whether others may reach it): what is above root is not looked at
    while pending:
        path, reachable = pending.pop()
        why, st = _why_unsafe(path, reachable)
        if why is not None:
            return path, why
        if stat.S_ISDIR(st.st_mode):
            if path == root:  # of what is in it, only the kernel caches' folders
                inside = [os.path.join(root, sub) for sub in subfolders]
            else:
                try:
                    with os.scandir(path) as entries:
                        inside = [entry.path for entry in entries]
                except OSError as e:
                    return path, f"cannot be listed ({e})"
            pending.extend((entry, reachable and _opens_to_others(st)) for entry in inside)
    return None


def _private_folder(root: str) -> str:
    """This process's folder in `root`: made by mkdtemp (mode 0700, an unguessable name), and made
    anew should it stop being a folder of this user's alone (renamed away and replaced, in a root
    others can write to)."""
    folder = _private.get(root)
    if folder is None or _why_unsafe(folder)[0] is not None or not os.path.isdir(folder):
        _make_private_dirs(root)
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


def point_kernel_caches() -> None:
    """Send Inductor's and Triton's caches under the configured directory (called before a fusion
    executor compiles; the user's own settings win), if it and what is under them is the user's own
    (see `_first_unsafe`): the kernel caches hold code Inductor and Triton load and run. Decided
    once per directory and process; the warning, when there is one, too."""
    root = directory()
    if root is None:
        return
    with _lock:
        if root in _kernel_caches_decided:
            return
        _kernel_caches_decided.add(root)
        caches = [(variable, sub) for variable, sub in KERNEL_CACHES if variable not in os.environ]
        if not caches:  # both set already, by the user or for an earlier directory: nothing to check
            return
        path = os.path.abspath(root)
        with contextlib.suppress(OSError):  # one that cannot be made is refused just below
            _make_private_dirs(path)
        why = _why_unsafe(path)[0]
        if why is None:
            try:  # Inductor and Triton fail on a cache they cannot write: leave them their defaults then
                for _, sub in caches:
                    _make_private_dirs(os.path.join(path, sub))
            except OSError as e:
                warnings.warn(f"thunderfn: cannot write to cache_dir {path!r} ({e}); Inductor's and Triton's "
                              f"kernel caches keep their default locations.", stacklevel=2)
                return
            unsafe = _first_unsafe(path, [sub for _, sub in caches])
        else:
            unsafe = path, why
        if unsafe is not None:
            warnings.warn(
                f"thunderfn: not pointing Inductor's and Triton's kernel caches into cache_dir {path!r}: "
                f"{unsafe[0]!r} {unsafe[1]}. They load and run the code found there, so only you may write to "
                f"cache_dir (chmod 700 keeps others out of all of it), and everything in its inductor/ and triton/ "
                f"folders must be yours and no symlink: remove what is not. They keep their default locations.",
                stacklevel=2)
            return
        for variable, sub in caches:
            os.environ.setdefault(variable, os.path.join(path, sub))


# -- compiled entries (disk_cache.py): <dir>/entries/<lookup>/<entry>.json ------------------------------------
ENTRIES = "entries"
_unsafe_warned: set = set()  # entry folders a warning was given for


def write_entry(lookup: str, name: str, text: str) -> bool:
    """Write a compiled entry's file as `<dir>/entries/<lookup>/<name>` (folders made mode 0700, the file made
    new and renamed into place); whether it is there now."""
    root = directory()
    if root is None or root in _unwritable:
        return False
    folder = os.path.join(os.path.abspath(root), ENTRIES, lookup)
    path = os.path.join(folder, name)
    try:
        _make_private_dirs(folder)
        if not os.path.lexists(path):  # (named by its contents' hash: one there already is the same)
            _write_new(path, text)
    except OSError as e:
        _unwritable.add(root)
        warnings.warn(f"thunderfn: cannot write compiled entries to cache_dir {root!r} ({e}); going on without "
                      f"(the next process compiles again). Give a directory you can write to.", stacklevel=2)
        return False
    return True


def remove_entry(lookup: str, name: str) -> None:
    """Remove an entry file write_entry wrote (one a later file replaces)."""
    root = directory()
    if root is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(os.path.abspath(root), ENTRIES, lookup, name))


def read_entries(lookup: str) -> list[tuple[str, str]]:
    """(path, text) of each entry file in `<dir>/entries/<lookup>`, newest first: those that pass the check the
    kernel caches pass (`_why_unsafe`: this user's, no symlink, not writable by others), as is every folder on
    the way from `<dir>`. An entry holds generated source that is compiled and run: a folder or file that fails
    the check is not read, and a warning (once per folder) names it."""
    root = directory()
    if root is None:
        return []
    root = os.path.abspath(root)
    folder = os.path.join(root, ENTRIES, lookup)
    if not os.path.isdir(folder):
        return []
    for path in (root, os.path.join(root, ENTRIES), folder):
        why = _why_unsafe(path)[0]
        if why is not None:
            _warn_unsafe(folder, path, why)
            return []
    found = []
    try:
        with os.scandir(folder) as entries:
            files = [entry.path for entry in entries if entry.name.endswith(".json")]
    except OSError:
        return []
    for path in files:
        why, st = _why_unsafe(path)
        if why is not None:
            _warn_unsafe(folder, path, why)
            continue
        try:
            with open(path, encoding="utf-8") as f:
                found.append((st.st_mtime_ns, path, f.read()))
        except OSError:
            continue
    return [(path, text) for _, path, text in sorted(found, reverse=True)]


def _warn_unsafe(folder: str, path: str, why: str) -> None:
    if folder in _unsafe_warned:
        return
    _unsafe_warned.add(folder)
    warnings.warn(f"thunderfn: not loading compiled entries from {folder!r}: {path!r} {why}. They hold code that "
                  f"would run, so only you may write to cache_dir (chmod 700 keeps others out of all of it); remove "
                  f"what is not yours. Compiling instead.", stacklevel=3)
