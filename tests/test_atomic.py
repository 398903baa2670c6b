import errno
import os

import pytest

from jemeval.atomic import write_text_atomic


def test_atomic_write_replaces_whole_file_with_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        (tmp_path / "sub").mkdir()
        path = write_text_atomic(tmp_path / "sub" / "r.json", "one")
        assert path.read_text() == "one" and (path.stat().st_mode & 0o777) == 0o644
        os.chmod(path, 0o640)
        write_text_atomic(path, "two")
        assert path.read_text() == "two" and (path.stat().st_mode & 0o777) == 0o640
    finally:
        os.umask(old)
    assert os.listdir(tmp_path / "sub") == ["r.json"]


def test_failed_write_leaves_previous_file_and_no_temp(tmp_path):
    from jemeval.atomic import write_atomic

    target = tmp_path / "ck.pt"
    target.write_text("previous")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_atomic(target, broken)
    assert target.read_text() == "previous" and os.listdir(tmp_path) == ["ck.pt"]


def test_missing_folder_is_refused_not_created(tmp_path):
    from jemeval.errors import UsageError

    with pytest.raises(UsageError, match="folder .*missing' does not exist; create it first"):
        write_text_atomic(tmp_path / "missing" / "r.json", "x")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("error, message", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on device writing"),
    (OSError(errno.EFBIG, "File too large"), "file too large writing"),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4160 vs 4048"),
     "no space left on device or file too large writing"),
])
def test_full_disk_is_one_line_and_keeps_the_previous_file(tmp_path, error, message):
    from jemeval.atomic import write_atomic
    from jemeval.errors import WriteError

    target = tmp_path / "r.json"
    target.write_text("previous")

    def full(tmp):
        tmp.write_text("half")
        raise error

    with pytest.raises(WriteError) as info:
        write_atomic(target, full)
    assert message in str(info.value) and repr(str(target)) in str(info.value) and "\n" not in str(info.value)
    assert target.read_text() == "previous" and os.listdir(tmp_path) == ["r.json"]


def test_full_disk_while_saving_a_checkpoint(tmp_path, monkeypatch):
    """torch.save's own message for a full disk ("enforce fail at inline_container.cc") becomes one line."""
    import torch

    import jemeval
    from jemeval.errors import WriteError
    from jemeval.formats.native import save_checkpoint

    model = jemeval.create_model("cnn", 3, (1, 4, 4), width=4)
    path = save_checkpoint(tmp_path / "m.pt", model)
    before = path.read_bytes()

    def torch_save_on_a_full_disk(obj, f, *args, **kwargs):
        with open(f, "wb") as fh:
            fh.write(b"PK\x03\x04 partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4160 vs 4048")

    monkeypatch.setattr(torch, "save", torch_save_on_a_full_disk)
    with pytest.raises(WriteError, match=r"no space left on device or file too large writing '.*m\.pt'"):
        save_checkpoint(path, model)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["m.pt"]


def test_other_write_errors_are_not_called_a_full_disk(tmp_path):
    from jemeval.atomic import write_atomic

    def broken(tmp):
        raise RuntimeError("some bug")

    with pytest.raises(RuntimeError, match="some bug"):
        write_atomic(tmp_path / "x", broken)
    assert os.listdir(tmp_path) == []


def test_new_file_gets_the_umask_permissions_without_touching_the_umask(tmp_path, monkeypatch):
    """The temporary file is created like open() creates one; the process-wide umask is never changed
    (a umask round trip races with other threads creating files)."""
    old = os.umask(0o027)
    try:
        def refuse(*args):
            raise AssertionError("os.umask called")

        monkeypatch.setattr(os, "umask", refuse)
        path = write_text_atomic(tmp_path / "r.json", "x")
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o640


def test_folder_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    import stat

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(
        "fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("rename"), real_replace(a, b))[1])
    write_text_atomic(tmp_path / "r.json", "x")
    assert events == ["fsync file", "rename", "fsync folder"]


def test_temp_name_never_follows_an_existing_file(tmp_path, monkeypatch):
    """A name that is taken (or a planted symlink) is skipped, not opened."""
    from jemeval import atomic

    names = iter(["a" * 8, "b" * 8])
    monkeypatch.setattr(atomic, "_random_name", lambda: next(names))
    decoy = tmp_path / "elsewhere"
    decoy.write_text("keep")
    (tmp_path / ".r.json.aaaaaaaa.tmp").symlink_to(decoy)
    path = atomic.write_text_atomic(tmp_path / "r.json", "x")
    assert path.read_text() == "x" and decoy.read_text() == "keep"
    # the planted link is not a temporary file jemeval wrote: never listed for removal, never removed
    assert atomic.stale_temp_files(tmp_path, r"r\.json") == []
    assert (tmp_path / ".r.json.aaaaaaaa.tmp").is_symlink()
