"""What a user sees of a compile: progress on stderr when it runs long (core/progress.py),
and where its artifacts go (core/artifacts.py)."""
import os
import stat
import time
import warnings

import pytest
import torch

import thunderfn as tf
from thunderfn.core import artifacts, progress


def _slow_to_trace(x):
    time.sleep(0.3)  # runs while tracing: a compile that takes long
    return x.sin() * 2


def test_a_long_compile_reports_its_stages_and_their_times_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(progress, "THRESHOLD_S", 0.1)
    tf.jit(_slow_to_trace)(torch.randn(3))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("thunderfn: compiling '_slow_to_trace' (0.1 s so far): tracing")
    assert any("lowering onto executors, code generation" in line for line in err)
    assert err[-1].startswith("thunderfn: compiled '_slow_to_trace' in ") and "tracing 0.3 s" in err[-1]


def test_a_short_compile_prints_nothing_and_progress_can_be_silenced(monkeypatch, capsys):
    tf.jit(lambda x: x + 1)(torch.randn(3))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "THRESHOLD_S", 0.1)
    monkeypatch.setenv("THUNDERFN_PROGRESS", "0")
    tf.jit(_slow_to_trace)(torch.randn(3))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("how", ["option", "environment"])
def test_cache_dir_holds_each_compiled_traces_source_and_tracebacks_point_there(tmp_path, monkeypatch, how):
    def divides(x, y):
        return torch.div(x, y, rounding_mode="floor")

    if how == "environment":
        monkeypatch.setenv("THUNDERFN_CACHE_DIR", str(tmp_path))
        jf = tf.jit(divides)
    else:
        jf = tf.jit(divides, cache_dir=tmp_path)
    jf(torch.ones(3), torch.full((3,), 2.0))
    (private,) = [p for p in tmp_path.iterdir() if p.name.startswith("thunderfn-")]
    written = sorted(os.listdir(private))
    assert len(written) == 1 and written[0].startswith("computation_")
    source = (private / written[0]).read_text()
    assert source == tf.last_traces(jf)[-1].python_callable().__thunderfn_source__
    with pytest.raises(RuntimeError) as caught:  # integer division by zero, raised by the (second) compiled code
        jf(torch.ones(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    files = [str(entry.path) for entry in caught.traceback]
    assert any(f.startswith(str(private)) for f in files)


# -- cache_dir safety ------------------------------------------------------------------------------
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


def _without_kernel_cache_settings(monkeypatch):
    """Unset for the test, and afterwards as they were (set first, so that the undo restores them)."""
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(variable, "unset by the test")
        monkeypatch.delenv(variable)


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


def test_kernel_caches_are_not_pointed_into_a_cache_dir_that_cannot_be_written(tmp_path, monkeypatch):
    _without_kernel_cache_settings(monkeypatch)
    root = tmp_path / "read_only"
    root.mkdir(mode=0o700)
    _refusing_writes_under(monkeypatch, root)
    with artifacts.writing_to(root), pytest.warns(UserWarning, match="cannot write to cache_dir .*default locations"):
        artifacts.point_kernel_caches()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "TRITON_CACHE_DIR" not in os.environ


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


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_kernel_caches_are_not_pointed_into_a_cache_dir_others_can_write(tmp_path, monkeypatch, mode):
    _without_kernel_cache_settings(monkeypatch)
    shared = tmp_path / f"shared{mode:o}"
    shared.mkdir()
    shared.chmod(mode)
    with artifacts.writing_to(shared), pytest.warns(UserWarning, match="only you can write"):
        artifacts.point_kernel_caches()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "TRITON_CACHE_DIR" not in os.environ
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    with artifacts.writing_to(own), warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.point_kernel_caches()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(own / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(own / "triton")


def test_kernel_caches_are_not_pointed_into_a_symlink_or_another_users_directory(tmp_path, monkeypatch):
    _without_kernel_cache_settings(monkeypatch)
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(own)
    with artifacts.writing_to(link), pytest.warns(UserWarning, match="symlink"):
        artifacts.point_kernel_caches()
    monkeypatch.setattr(os, "getuid", lambda: 12345)
    with artifacts.writing_to(own), pytest.warns(UserWarning, match="not by this user"):
        artifacts.point_kernel_caches()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
