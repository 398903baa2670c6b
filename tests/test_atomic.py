import os

import pytest

from jemeval.atomic import write_text_atomic


def test_atomic_write_replaces_whole_file_with_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
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
