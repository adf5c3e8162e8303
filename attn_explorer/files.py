"""Writing result files safely: atomic writes and the .npz layout shared by the CLI and the GUI."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from attn_explorer.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """write(tmp_path) into a temporary file beside path, then rename it over path.

    A failure at any point removes the temporary file: no half-written output is ever left.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"output folder does not exist: {path.parent}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def result_arrays(r) -> dict[str, np.ndarray]:
    """The arrays of a RunResult as saved to .npz: strings as NumPy unicode, so np.load needs no pickles."""
    d = {
        "attentions": np.ascontiguousarray(r.attentions, dtype=np.float32),  # (L, H, N, N)
        "tokens": np.asarray(list(r.tokens), dtype=np.str_),
        "special": np.asarray(r.special, dtype=bool),
        "model": np.asarray(str(r.model), dtype=np.str_),
        "dk_scale": np.asarray(float(r.dk_scale), dtype=np.float64),
    }
    if r.grid is not None:
        d["grid"] = np.asarray(r.grid, dtype=np.int64)
    return d


def save_npz(r, path: str | os.PathLike) -> Path:
    arrays = result_arrays(r)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    return atomic_write(path, write)
