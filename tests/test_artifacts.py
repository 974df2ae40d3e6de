"""Where compiled artifacts go, and when that is safe (core/artifacts.py): thunderfn's sources in a
folder private to the process, written without following anything planted there; Inductor's and
Triton's kernel caches pointed into cache_dir only when it and everything under their folders is
this user's alone, since they load and run what they find there."""
import os
import stat
import warnings

import pytest
import torch

import thunderfn as tf
from thunderfn.core import artifacts

KERNEL_CACHE_VARIABLES = [variable for variable, _ in artifacts.KERNEL_CACHES]


@pytest.fixture(autouse=True)
def _fresh_kernel_cache_settings(monkeypatch):
    """Each test starts as a new process would: the kernel cache variables unset and no directory
    checked; afterwards both are as they were (the variables set first, so that the undo restores them
    whatever the test's point_kernel_caches wrote)."""
    for variable in KERNEL_CACHE_VARIABLES:
        monkeypatch.setenv(variable, "unset by the test")
        monkeypatch.delenv(variable)
    monkeypatch.setattr(artifacts, "_kernel_caches_decided", set())


def _kernel_caches_unset():
    return not any(variable in os.environ for variable in KERNEL_CACHE_VARIABLES)


def _pointed_into(root):
    return [os.environ.get(variable) for variable in KERNEL_CACHE_VARIABLES] == [
        str(root / "inductor"), str(root / "triton")]


def _refusing_writes_under(monkeypatch, root):
    """os.open and os.mkdir raise PermissionError under `root`, as on a read-only directory (the tests
    run as root, which file permissions do not stop)."""
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(real):
        def call(path, *args, **kwargs):
            if os.fspath(path).startswith(str(root)):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "open", refuse(real_open))
    monkeypatch.setattr(os, "mkdir", refuse(real_mkdir))


def _cache_tree(root):
    """A kernel cache tree as an earlier process of this user leaves it (made with this umask; which
    files Inductor and Triton actually write does not matter to the check): returns its deepest file."""
    root.mkdir(mode=0o700)
    with artifacts.writing_to(root):
        artifacts.point_kernel_caches()
    deep = root / "inductor" / "fxgraph" / "ab" / "cd"
    deep.mkdir(parents=True)
    for n in range(3):
        (deep / f"kernel_{n}.py").write_text("def kernel(): pass\n")
    (root / "triton" / "XYZ").mkdir(parents=True)
    (root / "triton" / "XYZ" / "kernel.so").write_bytes(b"\x7fELF")
    return deep / "kernel_0.py"


def _open_to_others(root, entry):
    """Let group and others enter every folder from `root` down to `entry`, so that they could reach
    it (the folders thunderfn makes are mode 0700, which puts everything under them out of reach)."""
    folder = entry.parent
    while folder != root.parent:
        folder.chmod(0o755)
        folder = folder.parent


def _shared_folder(path):
    """A folder everyone may write to (mkdir's mode is cut by the umask; chmod's is not)."""
    path.mkdir()
    path.chmod(0o777)
    return path


def _as_a_new_process(monkeypatch):
    for variable in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(artifacts, "_kernel_caches_decided", set())


def _refused(root, path, why):
    """point_kernel_caches on `root` warns naming `path` and `why`, and leaves the variables unset."""
    with artifacts.writing_to(root), pytest.warns(UserWarning) as caught:
        artifacts.point_kernel_caches()
    (warning,) = caught
    assert str(warning.message).startswith(
        f"thunderfn: not pointing Inductor's and Triton's kernel caches into cache_dir {str(root)!r}: "
        f"{str(path)!r} {why}. They load and run the code found there")
    assert "They keep their default locations." in str(warning.message)
    assert _kernel_caches_unset()


def _owned_by(monkeypatch, path, uid):
    """os.lstat reports `path` as owned by `uid` (everything else as it is)."""
    real_lstat = os.lstat

    def lstat(p, *args, **kwargs):
        st = real_lstat(p, *args, **kwargs)
        if os.fspath(p) != str(path):
            return st
        fields = list(st[:10])
        fields[4] = uid  # st_uid
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", lstat)


# -- thunderfn's own sources -----------------------------------------------------------------------
@pytest.mark.parametrize("when", ["from the start", "between calls"])
def test_an_unwritable_cache_dir_warns_once_and_compiling_goes_on(tmp_path, monkeypatch, when):
    root = tmp_path / "cache"
    if when == "between calls":
        tf.jit(lambda x: x * 3, cache_dir=root)(torch.ones(2))  # wrote its source there
    _refusing_writes_under(monkeypatch, root)
    with pytest.warns(UserWarning, match="cannot write compiled sources to cache_dir .*going on without writing"):
        torch.testing.assert_close(tf.jit(lambda x: x + 1, cache_dir=root)(torch.ones(2)), torch.full((2,), 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per directory
        torch.testing.assert_close(tf.jit(lambda x: x - 1, cache_dir=root)(torch.ones(2)), torch.zeros(2))


def test_a_symlink_planted_in_a_shared_cache_dir_is_never_written_through(tmp_path):
    root, victim = tmp_path / "shared", tmp_path / "victim.txt"
    root.mkdir()
    victim.write_text("precious")
    # every name the old layout would have used, and likely new ones, point at the victim
    (root / "thunderfn").symlink_to(tmp_path)
    for n in range(50):
        for name in (f"computation_{n}.py", f"computation_{n}.py.{os.getpid()}.tmp"):
            (root / name).symlink_to(victim)
    jf = tf.jit(lambda x: x * 2, cache_dir=root)
    torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), 2.0))
    assert victim.read_text() == "precious"
    (private,) = [p for p in root.iterdir() if p.name.startswith("thunderfn-")]
    assert stat.S_IMODE(private.lstat().st_mode) == 0o700 and not private.is_symlink()
    (written,) = private.iterdir()
    assert not written.is_symlink() and stat.S_IMODE(written.lstat().st_mode) == 0o600


def test_a_file_is_created_new_never_reused(tmp_path):
    target, victim = tmp_path / "file.py", tmp_path / "victim.txt"
    victim.write_text("precious")
    artifacts._write_new(str(target), "source")
    assert target.read_text() == "source"
    (tmp_path / f"link.py.{os.getpid()}.tmp").symlink_to(victim)  # a planted temporary name
    with pytest.raises(FileExistsError):
        artifacts._write_new(str(tmp_path / "link.py"), "source")
    assert victim.read_text() == "precious"


def test_a_private_folder_swapped_for_a_symlink_is_replaced_not_written_through(tmp_path):
    root, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    _shared_folder(root)
    elsewhere.mkdir()
    jf = tf.jit(lambda x: x * 2, cache_dir=root)
    jf(torch.ones(2))
    (private,) = [p for p in root.iterdir() if p.name.startswith("thunderfn-")]
    private.rename(tmp_path / "renamed away")  # as another user can, in a folder they may write to
    private.symlink_to(elsewhere)
    tf.jit(lambda x: x * 3, cache_dir=root)(torch.ones(2))
    assert list(elsewhere.iterdir()) == []
    (new,) = [p for p in root.iterdir() if p.name.startswith("thunderfn-") and not p.is_symlink()]
    assert len(list(new.iterdir())) == 1


def test_the_folders_thunderfn_makes_are_private_parents_too(tmp_path):
    root = tmp_path / "made" / "by" / "thunderfn"
    with artifacts.writing_to(root):
        artifacts.point_kernel_caches()
    assert _pointed_into(root)
    for folder in (tmp_path / "made", tmp_path / "made" / "by", root, root / "inductor", root / "triton"):
        assert stat.S_IMODE(folder.lstat().st_mode) == 0o700, folder


# -- the kernel caches: cache_dir itself -----------------------------------------------------------
def test_kernel_caches_are_not_pointed_into_a_cache_dir_that_cannot_be_written(tmp_path, monkeypatch):
    root = tmp_path / "read_only"
    root.mkdir(mode=0o700)
    _refusing_writes_under(monkeypatch, root)
    with artifacts.writing_to(root), pytest.warns(UserWarning, match="cannot write to cache_dir .*default locations"):
        artifacts.point_kernel_caches()
    assert _kernel_caches_unset()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_kernel_caches_are_not_pointed_into_a_cache_dir_others_can_write(tmp_path, mode):
    shared = tmp_path / f"shared{mode:o}"
    shared.mkdir()
    shared.chmod(mode)
    writers = {0o770: "group", 0o707: "others", 0o777: "group and others"}[mode]
    _refused(shared, shared, f"is writable by {writers} (mode {mode:o})")
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    with artifacts.writing_to(own), warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.point_kernel_caches()
    assert _pointed_into(own)


def test_kernel_caches_are_not_pointed_into_a_symlink_or_another_users_directory(tmp_path, monkeypatch):
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(own)
    _refused(link, link, "is a symlink")
    monkeypatch.setattr(os, "geteuid", lambda: 12345)
    _refused(own, own, f"is owned by uid {os.getuid()}, not by this user (uid 12345)")


# -- the kernel caches: everything under inductor/ and triton/ -------------------------------------
def test_a_cache_tree_an_earlier_process_of_this_user_left_is_accepted(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    _cache_tree(root)
    assert _pointed_into(root)
    _as_a_new_process(monkeypatch)
    with artifacts.writing_to(root), warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.point_kernel_caches()
    assert _pointed_into(root)


@pytest.mark.parametrize("where", ["a deep file", "a folder", "the inductor folder"])
def test_an_entry_owned_by_another_user_anywhere_in_the_caches_is_refused(tmp_path, monkeypatch, where):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    foreign = {"a deep file": deep_file, "a folder": root / "triton" / "XYZ", "the inductor folder": root / "inductor"}
    _owned_by(monkeypatch, foreign[where], 12345)
    _refused(root, foreign[where], f"is owned by uid 12345, not by this user (uid {os.geteuid()})")


@pytest.mark.skipif(getattr(os, "geteuid", lambda: None)() != 0, reason="needs root to chown a file to another user")
def test_a_file_really_chowned_to_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    os.chown(deep_file, 12345, 12345)
    _refused(root, deep_file, "is owned by uid 12345, not by this user (uid 0)")


def test_a_group_writable_file_in_the_caches_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    _open_to_others(root, deep_file)
    deep_file.chmod(0o664)
    _refused(root, deep_file, "is writable by group (mode 664)")


def test_a_world_writable_folder_in_the_caches_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    _open_to_others(root, deep_file)
    deep_file.parent.chmod(0o757)
    _refused(root, deep_file.parent, "is writable by others (mode 757)")


def test_what_a_umask_of_002_leaves_is_accepted_below_a_folder_only_this_user_may_enter(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    for entry in [deep_file.parent, *deep_file.parent.parents]:  # as Inductor leaves them under umask 002
        if entry == root / "inductor":
            break
        entry.chmod(0o775)
    for file in deep_file.parent.iterdir():
        file.chmod(0o664)
    for root_mode, inductor_mode in ((0o700, 0o700), (0o755, 0o700), (0o700, 0o755)):
        _as_a_new_process(monkeypatch)
        root.chmod(root_mode)
        (root / "inductor").chmod(inductor_mode)
        with artifacts.writing_to(root), warnings.catch_warnings():
            warnings.simplefilter("error")
            artifacts.point_kernel_caches()
        assert _pointed_into(root)
    _as_a_new_process(monkeypatch)
    root.chmod(0o755)  # now others may reach what is group-writable
    _refused(root, root / "inductor" / "fxgraph", "is writable by group (mode 775)")


def test_a_group_writable_file_with_a_second_name_elsewhere_is_refused_even_out_of_reach(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    os.link(deep_file, tmp_path / "second name")
    deep_file.chmod(0o664)
    _refused(root, deep_file, "is writable by group (mode 664)")


@pytest.mark.parametrize("target", ["file", "folder"])
def test_a_symlink_in_the_caches_is_refused_whatever_it_points_to(tmp_path, monkeypatch, target):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    link = root / "triton" / "XYZ" / "link"
    link.symlink_to(deep_file if target == "file" else deep_file.parent)  # both this user's own
    _refused(root, link, "is a symlink")


def test_a_fifo_in_the_caches_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    _cache_tree(root)
    _as_a_new_process(monkeypatch)
    fifo = root / "inductor" / "fxgraph" / "pipe"
    os.mkfifo(fifo, 0o600)
    _refused(root, fifo, "is neither a file nor a folder (a FIFO, socket or device)")


def test_the_check_runs_once_per_directory_and_process(tmp_path, monkeypatch):
    refused, accepted = tmp_path / "refused", tmp_path / "accepted"
    _cache_tree(accepted)
    _as_a_new_process(monkeypatch)
    _shared_folder(refused)
    _refused(refused, refused, "is writable by group and others (mode 777)")
    with artifacts.writing_to(refused), warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        artifacts.point_kernel_caches()
    with artifacts.writing_to(accepted):
        artifacts.point_kernel_caches()
    assert _pointed_into(accepted)

    def no_walk(*args):
        raise AssertionError("walked the tree again")

    monkeypatch.setattr(os, "scandir", no_walk)
    with artifacts.writing_to(accepted):
        artifacts.point_kernel_caches()


def test_the_users_own_kernel_cache_settings_win_and_skip_the_check(tmp_path, monkeypatch):
    shared = _shared_folder(tmp_path / "shared")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine too"))
    with artifacts.writing_to(shared), warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.point_kernel_caches()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    assert not (shared / "inductor").exists()


def test_only_the_cache_left_to_thunderfn_is_checked_and_pointed(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    deep_file = _cache_tree(root)
    _as_a_new_process(monkeypatch)
    deep_file.chmod(0o666)  # under inductor/, which the user's own setting replaces
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    with artifacts.writing_to(root), warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.point_kernel_caches()
    assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton")


def test_sources_still_go_to_the_private_folder_when_the_kernel_caches_are_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    _cache_tree(root)
    _as_a_new_process(monkeypatch)
    _open_to_others(root, root / "triton" / "XYZ")
    (root / "triton" / "XYZ").chmod(0o777)
    jf = tf.jit(lambda x: x * 2, cache_dir=root)
    torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), 2.0))
    _refused(root, root / "triton" / "XYZ", "is writable by group and others (mode 777)")
    (private,) = [p for p in root.iterdir() if p.name.startswith("thunderfn-")]
    assert stat.S_IMODE(private.lstat().st_mode) == 0o700 and len(list(private.iterdir())) == 1
