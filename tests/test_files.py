"""files.py: the one writer (atomic, never replaces a folder or a device, every failure one line naming the
path) and the one reader of user text files."""
from __future__ import annotations

import errno
import os
import stat
import tempfile

import pytest

from attn_explorer import files
from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write


def write_text(content: str):
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(content)

    return write


def only_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


# ---- atomic_write ---------------------------------------------------------------------------------

def test_writes_and_replaces_a_regular_file(tmp_path):
    target = tmp_path / "out.json"
    assert atomic_write(target, write_text("one")) == target
    assert target.read_text() == "one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~files._umask()  # not mkstemp's private 0600
    atomic_write(target, write_text("two"))
    assert target.read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_replacing_keeps_the_old_files_permissions(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write(target, write_text("new"))
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_an_existing_folder_is_refused_and_left_alone(tmp_path):
    target = tmp_path / "result.npz"
    target.mkdir()
    (target / "inside").write_text("keep")
    with pytest.raises(UserError) as e:
        atomic_write(target, write_text("x"))
    assert str(target) in only_line(e) and "is a folder" in str(e.value)
    assert (target / "inside").read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["result.npz"]


def test_a_special_file_is_never_replaced(tmp_path):
    """A FIFO stands in for /dev/null: os.replace would swap the node for a regular file."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(UserError) as e:
        atomic_write(fifo, write_text("x"))
    assert str(fifo) in only_line(e) and "not a regular file" in str(e.value)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO
    assert [p.name for p in tmp_path.iterdir()] == ["pipe.json"]


@pytest.mark.skipif(not hasattr(os, "mknod") or os.geteuid() != 0, reason="making a device node needs root")
def test_a_character_device_is_never_replaced(tmp_path):
    """A private copy of /dev/null (char device 1, 3) in tmp_path: the real one is never put at risk."""
    node = tmp_path / "null.json"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with pytest.raises(UserError) as e:
        atomic_write(node, write_text("x"))
    assert str(node) in only_line(e)
    assert stat.S_ISCHR(os.lstat(node).st_mode) and [p.name for p in tmp_path.iterdir()] == ["null.json"]


def test_a_symlink_stays_a_link_and_its_target_gets_the_content(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic_write(link, write_text("new"))
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_file_descriptor_link_is_refused(tmp_path):
    """/dev/stdout is a link to /proc/self/fd/1: renaming over whatever the shell redirected stdout into
    would swap that file away from under the shell. The same with a descriptor of our own."""
    real = tmp_path / "redirected.txt"
    with open(real, "w") as f:
        f.write("what the shell wrote")
        f.flush()
        link = tmp_path / "stdout.json"
        link.symlink_to(f"/proc/self/fd/{f.fileno()}")
        with pytest.raises(UserError) as e:
            atomic_write(link, write_text("x"))
    assert str(link) in only_line(e) and "not a regular file" in str(e.value)
    assert real.read_text() == "what the shell wrote" and link.is_symlink()


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO])
@pytest.mark.parametrize("stage", ["mkstemp", "write", "replace"])
def test_write_errors_are_one_line_and_the_old_file_survives(tmp_path, monkeypatch, err, stage):
    target = tmp_path / "result.npz"
    target.write_bytes(b"previous")

    def fail(*a, **k):
        raise OSError(err, os.strerror(err))

    write = write_text("new")
    if stage == "mkstemp":
        monkeypatch.setattr(tempfile, "mkstemp", fail)
    elif stage == "write":
        write = fail
    else:
        monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(UserError) as e:
        atomic_write(target, write)
    message = only_line(e)
    assert message == f"cannot write {target}: {os.strerror(err)}"
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["result.npz"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders anyway")
def test_a_read_only_folder_is_one_line(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(UserError) as e:
            atomic_write(folder / "x.json", write_text("x"))
        assert str(folder / "x.json") in only_line(e) and "Permission denied" in str(e.value)
    finally:
        folder.chmod(0o700)


def test_an_interrupted_write_leaves_nothing(tmp_path):
    def interrupted(tmp):
        open(tmp, "w").write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "x.json", interrupted)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        atomic_write(tmp_path / "nope" / "x.json", write_text("x"))
    assert "does not exist" in only_line(e)


def test_non_finite_attention_is_never_written(tmp_path):
    import numpy as np

    from attn_explorer.api.result import RunResult

    att = np.full((1, 1, 2, 2), np.nan, dtype=np.float32)
    r = RunResult(attentions=att, tokens=["a", "b"], special=np.zeros(2, bool), model="m", dk_scale=1.0,
                  forward_ms=0.0)
    with pytest.raises(UserError) as e:
        files.save_npz(r, tmp_path / "x.npz")
    assert "NaN" in only_line(e) and list(tmp_path.iterdir()) == []


# ---- read_text_file -------------------------------------------------------------------------------

def sparse(path, size: int):
    """A file of `size` zero bytes that takes no disk space (nothing is written)."""
    with open(path, "wb") as f:
        os.truncate(f.fileno(), size)
    return path


def test_reads_utf8_text_and_drops_a_byte_order_mark(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes("\ufeffcafé, naïve".encode("utf-8"))
    assert files.read_text_file(p) == "café, naïve"


@pytest.mark.parametrize("make, words", [
    (lambda p: None, "not found"),
    (lambda p: p.mkdir(), "is a folder"),
    (os.mkfifo, "not a regular file"),  # reading would block until someone writes
    (lambda p: p.write_bytes("café".encode("latin-1")), "not UTF-8"),
    (lambda p: sparse(p, files.MAX_TEXT_BYTES + 1), "larger than"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: p.write_bytes(b"\x00\x00 \n\t\xe2\x80\x8b"), "is empty"),  # NUL, white space, zero-width space
])
def test_bad_text_files_are_one_line(tmp_path, make, words):
    p = tmp_path / "t.txt"
    make(p)
    with pytest.raises(UserError) as e:
        files.read_text_file(p)
    assert words in only_line(e) and "t.txt" in str(e.value)


def test_a_text_file_over_a_megabyte_is_read_whole(tmp_path):
    """2 MB typed or pasted runs (the model keeps its first tokens); the same 2 MB in a file must too."""
    p = tmp_path / "t.txt"
    p.write_bytes(b"word " * 400_000)
    assert files.read_text_file(p) == "word " * 400_000


def test_the_text_size_limit_is_the_same_for_files_and_typed_text(tmp_path):
    """One limit, for truly huge input (a log, a disk image): a file over it and text over it are refused
    with the same words; the model reads a few thousand words at most either way."""
    import attn_explorer as ax

    assert files.MAX_TEXT_BYTES >= 4_000_000
    p = sparse(tmp_path / "t.txt", files.MAX_TEXT_BYTES + 1)
    with pytest.raises(UserError) as e:
        files.read_text_file(p)
    from_file = only_line(e)
    with pytest.raises(UserError) as e:
        ax.load_model("textbook", device="cpu").run("word " * (files.MAX_TEXT_BYTES // 5 + 1))
    typed = only_line(e)
    limit = f"larger than {files.MAX_TEXT_BYTES / 1e6:g} MB"
    assert limit in from_file and limit in typed and from_file.startswith("t.txt is larger")


def test_an_unreadable_text_file_is_one_line(tmp_path, monkeypatch):
    p = tmp_path / "t.txt"
    p.write_text("hello")
    real_open = open

    def deny(path, *a, **k):
        if str(path) == str(p):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(UserError) as e:
        files.read_text_file(p)
    assert only_line(e) == f"cannot read {p}: Permission denied"
