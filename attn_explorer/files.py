"""The user's files: the one atomic writer, the one reader of text files, and the .npz layout shared by
the CLI and the GUI. Every failure is one UserError line naming the path and the reason."""
from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.validate import MAX_TEXT_BYTES, finite_attention, has_visible_text  # noqa: F401 - re-exported


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


def _is_descriptor_link(path: Path) -> bool:
    """Whether path leads through /proc/*/fd or /dev/fd, as /dev/stdout does: a stream of this process,
    whatever file it happens to point at, is not a file name to rename over."""
    p = os.path.abspath(path)
    for _ in range(40):  # symlink hops; more is a loop, which os.stat reports
        if p.startswith("/dev/fd/") or re.match(r"/proc/[^/]+/fd/", p):
            return True
        if not os.path.islink(p):
            return False
        p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
    return False


def _existing_target(path: Path) -> tuple[Path, os.stat_result | None]:
    """The regular file that path names (through a symlink), with its stat; None when there is none yet.
    A folder, a device (/dev/null), a pipe, a socket or a process's stream (/dev/stdout) is refused:
    renaming over it would replace the node."""
    if _is_descriptor_link(path):
        raise UserError(f"cannot write {path}: it is not a regular file (a process's stream); give a file name")
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target, None
    except OSError as e:
        raise UserError(f"cannot write {path}: {_reason(e)}") from e
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"cannot write {path}: it is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"cannot write {path}: it is not a regular file (a device, pipe or socket); "
                        "give a file name")
    return target, st


def check_output(path: str | os.PathLike) -> Path:
    """Refuse, before any work, an output path that atomic_write would refuse: its folder missing, or a
    folder or device in its place. Returns path."""
    path = Path(path)
    target, _ = _existing_target(path)
    if not target.parent.is_dir():
        raise UserError(f"output folder does not exist: {path.parent}")
    return path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """write(tmp_path) into a temporary file beside path, then rename it over path.

    A failure at any point removes the temporary file and leaves an existing file as it was; an OSError
    (read-only folder, full disk) becomes one UserError line. Only a regular file is ever replaced, with
    its permissions kept; a symlink stays a link and its target gets the new content.
    """
    path = check_output(path)
    target, st = _existing_target(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp" + target.suffix, dir=target.parent)
        os.close(fd)
    except OSError as e:
        raise UserError(f"cannot write {path}: {_reason(e)}") from e
    try:
        write(tmp)
        # mkstemp makes 0600: keep the replaced file's mode, or give a new file the usual one
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise UserError(f"cannot write {path}: {_reason(e)}") from e
        raise
    return path


def read_text_file(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped), for the CLI's --text-file and the GUI's
    File → Open text. Refused with one line: missing, a folder or device, over max_bytes (the same limit
    as typed text, `validate.MAX_TEXT_BYTES`), not UTF-8, or nothing visible in it. A long text is read
    whole: the model cuts it, as it cuts typed text."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UserError(f"text file not found: {p}") from None
    except OSError as e:
        raise UserError(f"cannot read {p}: {_reason(e)}") from e
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{p} is a folder, not a text file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{p} is not a regular file (a device, pipe or socket)")
    too_big = (f"{p.name} is larger than {max_bytes / 1e6:g} MB, too large to read as text; give a shorter text "
               "(a model reads only its first few thousand words)")
    if st.st_size > max_bytes:
        raise UserError(too_big)
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)  # the file may have grown since stat
    except OSError as e:
        raise UserError(f"cannot read {p}: {_reason(e)}") from e
    if len(data) > max_bytes:
        raise UserError(too_big)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{p.name} is not UTF-8 text (byte {e.start} is {data[e.start]:#04x})") from None
    if not has_visible_text(text):
        raise UserError(f"{p.name} is empty (no visible characters)")
    return text


def result_arrays(r, view: dict | None = None, image: bool = True) -> dict[str, np.ndarray]:
    """The arrays of a RunResult as saved to .npz: strings as NumPy unicode, so np.load needs no pickles.
    Attention with NaN or infinity is refused: a wrong file is worse than none. What the window needs to
    reopen the file (session.reopen) is there too: an image run's pixels ("image", with image=True) and,
    when given, the view it was saved from ("view": JSON text of page, selection and options); a text run
    without a view has the five arrays it always had."""
    d = {
        "attentions": finite_attention(np.ascontiguousarray(r.attentions, dtype=np.float32)),  # (L, H, N, N)
        "tokens": np.asarray(list(r.tokens), dtype=np.str_),
        "special": np.asarray(r.special, dtype=bool),
        "model": np.asarray(str(r.model), dtype=np.str_),
        "dk_scale": np.asarray(float(r.dk_scale), dtype=np.float64),
    }
    if getattr(r, "routing", None) is not None:  # MoE: routing_experts / routing_weights (L, N, k), routing_num_experts
        d.update(r.routing.arrays())
    if getattr(r, "sinks", None) is not None:  # gpt-oss: (L, H, N) each row's share given to its head's sink
        d["sinks"] = np.ascontiguousarray(r.sinks, dtype=np.float32)
    if r.grid is not None:
        d["grid"] = np.asarray(r.grid, dtype=np.int64)
        if image and r.image is not None:
            d["image"] = np.ascontiguousarray(r.image, dtype=np.uint8)  # (H, W, 3): the pixels the model saw
    if view:
        import json

        d["view"] = np.asarray(json.dumps(view), dtype=np.str_)
    return d


def save_npz(r, path: str | os.PathLike, view: dict | None = None) -> Path:
    arrays = result_arrays(r, view)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    return atomic_write(path, write)
