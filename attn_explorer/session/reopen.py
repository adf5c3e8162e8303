"""A saved run (.npz) back as a RunResult, for the window to show without its model.

The file is what `files.result_arrays` / `save_npz` write (the CLI's `export --out run.npz` and the
window's File → Export): attentions (L, H, N, N) float32, tokens, special, model, dk_scale, for images
grid and (newer files) the pixels in "image", for an encoder-decoder's `export --target` the decoder's
and cross-attention's maps, and (window exports) the view it was saved from as JSON text in "view".
Exactly that is read back, every array checked against the others; a file that is damaged or not such
a run is refused with one UserError line, and nothing else is read from it (no pickles).

`info_for_result` describes a result whose model is not loaded (a `ModelInfo` with what the arrays
tell: layers, heads, tokens, image or text), so the pages can draw it; its note says the model is not
loaded.
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn_explorer.api.result import ModelInfo, Routing, RunResult
from attn_explorer.errors import UserError

REQUIRED = ("attentions", "tokens", "special", "model", "dk_scale")
MAX_BYTES = 8 << 30  # a run's file beyond this is not something the window could show anyway


@dataclass
class SavedRun:
    """A run read from a file: its result, a description of its (absent) model, and the view it was
    saved from ({} when the file does not say)."""

    result: RunResult
    info: ModelInfo
    view: dict = field(default_factory=dict)
    path: str = ""

    @property
    def label(self) -> str:
        """How the window names it: "run.npz"."""
        return Path(self.path).name if self.path else "a result in memory"


def read_run(path: str | os.PathLike) -> SavedRun:
    """The run saved in `path`. Refused in one line: missing, not an .npz, damaged, not a run, or arrays
    that do not fit together."""
    p = Path(path)
    name = p.name
    if not p.exists():
        raise UserError(f"saved run not found: {p}")
    if p.is_dir():
        raise UserError(f"{p} is a folder, not a saved run (.npz)")
    if p.stat().st_size > MAX_BYTES:
        raise UserError(f"{name} is larger than {MAX_BYTES >> 30} GB: too large to open as a saved run")
    try:
        with np.load(p, allow_pickle=False) as z:
            missing = [k for k in REQUIRED if k not in z.files]
            if missing:
                raise UserError(f"{name} is not a saved attn-explorer run: it has no {', '.join(missing)} "
                                "(export one with `export --out run.npz` or File → Export)")
            arrays = {k: z[k] for k in z.files}  # reads (and CRC-checks) every member now
    except UserError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError, KeyError) as e:
        raise UserError(f"{name} is damaged or not an .npz file ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None
    return _from_arrays(arrays, name, str(p))


def _damaged(name: str, why: str) -> UserError:
    return UserError(f"{name} is damaged: {why}")


def _maps(a: np.ndarray, name: str, key: str) -> np.ndarray:
    """A stack of maps: float (L, H, R, C), finite, each weight in [0, 1]."""
    if a.ndim != 4 or a.dtype.kind != "f" or 0 in a.shape:
        raise _damaged(name, f"{key} should be a non-empty float array (layers, heads, rows, columns), "
                             f"not {a.dtype} {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all() or a.min() < -1e-6 or a.max() > 1 + 1e-4:
        raise _damaged(name, f"{key} holds values that are not attention weights (NaN, infinite or outside 0..1)")
    return a


def _strings(a: np.ndarray, name: str, key: str, n: int) -> list[str]:
    if a.dtype.kind != "U" or a.shape != (n,):
        raise _damaged(name, f"{key} should be {n} strings, not {a.dtype} {a.shape}")
    return [str(t) for t in a]


def _flags(a: np.ndarray, name: str, key: str, n: int) -> np.ndarray:
    if a.dtype != bool or a.shape != (n,):
        raise _damaged(name, f"{key} should be {n} true/false flags, not {a.dtype} {a.shape}")
    return a.astype(bool)


def _from_arrays(d: dict[str, np.ndarray], name: str, path: str = "") -> SavedRun:
    att = _maps(d["attentions"], name, "attentions")
    L, H, N, M = att.shape
    if N != M:
        raise _damaged(name, f"attentions should be square (N × N) maps, not {N} × {M}")
    tokens = _strings(d["tokens"], name, "tokens", N)
    special = _flags(d["special"], name, "special", N)
    if d["model"].dtype.kind != "U" or d["model"].ndim != 0:
        raise _damaged(name, "model should be one string")
    model = str(d["model"])
    dk = d["dk_scale"]
    if dk.ndim != 0 or dk.dtype.kind not in "fi" or not np.isfinite(dk) or float(dk) <= 0:
        raise _damaged(name, "dk_scale should be one positive number")
    grid, image, offset = None, None, 0
    if "grid" in d:
        g = d["grid"]
        if g.shape != (2,) or g.dtype.kind not in "iu" or (g < 1).any() or int(g[0] * g[1]) > N:
            raise _damaged(name, f"grid should be (rows, cols) of at most {N} patches")
        grid = (int(g[0]), int(g[1]))
        offset = N - grid[0] * grid[1]  # the tokens before the patches ([CLS], registers)
        if "image" in d:
            image = d["image"]
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise _damaged(name, f"image should be uint8 (height, width, 3), not {image.dtype} {image.shape}")
    dec = {}
    if "decoder_attentions" in d or "cross_attentions" in d:
        dec = _decoder(d, name, H, N)
    view = _view(d, name)
    sinks = _sinks(d["sinks"], name, (L, H, N)) if "sinks" in d else None
    routing = _routing(d, name, L, N) if "routing_experts" in d else None
    r = RunResult(attentions=att, tokens=tokens, special=special, model=model, dk_scale=float(dk), forward_ms=0.0,
                  grid=grid, image=image, total_tokens=N, patch_offset=offset, sinks=sinks, routing=routing, **dec)
    return SavedRun(result=r, info=info_for_result(r, Path(path).name if path else ""), view=view, path=path)


def _sinks(a: np.ndarray, name: str, shape: tuple[int, int, int]) -> np.ndarray:
    """gpt-oss's sink shares (L, H, N), each in [0, 1]."""
    if a.dtype.kind != "f" or a.shape != shape or not np.isfinite(a).all() or (a < 0).any() or (a > 1).any():
        raise _damaged(name, f"sinks should be {shape} shares between 0 and 1, not {a.dtype} {a.shape}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _routing(d: dict[str, np.ndarray], name: str, L: int, N: int) -> Routing:
    """An MoE run's routing (export's routing_experts, routing_weights, routing_num_experts): each layer's
    experts all -1 (a dense layer) or all in 0..E-1, the weights finite."""
    if "routing_weights" not in d or "routing_num_experts" not in d:
        raise _damaged(name, "it has routing_experts but no routing_weights or routing_num_experts")
    ex, w, E = d["routing_experts"], d["routing_weights"], d["routing_num_experts"]
    if E.ndim != 0 or E.dtype.kind not in "iu" or int(E) < 1:
        raise _damaged(name, "routing_num_experts should be one whole number >= 1")
    if (ex.dtype.kind not in "iu" or ex.ndim != 3 or ex.shape[:2] != (L, N) or w.shape != ex.shape
            or w.dtype.kind != "f" or not np.isfinite(w).all()):
        raise _damaged(name, f"routing_experts and routing_weights should be ({L}, {N}, k) whole numbers and "
                             f"finite weights, not {ex.dtype} {ex.shape} and {w.dtype} {w.shape}")
    for layer in ex:
        if not ((layer == -1).all() or ((layer >= 0) & (layer < int(E))).all()):
            raise _damaged(name, f"routing_experts should be -1 (a dense layer) or experts 0..{int(E) - 1}")
    return Routing.from_arrays(ex, w, int(E))


def _decoder(d: dict[str, np.ndarray], name: str, H: int, S: int) -> dict:
    """An encoder-decoder's decoder and cross-attention maps (export --target), checked against the encoder's."""
    for k in ("decoder_attentions", "cross_attentions", "decoder_tokens", "decoder_special"):
        if k not in d:
            raise _damaged(name, f"it has decoder maps but no {k}")
    da = _maps(d["decoder_attentions"], name, "decoder_attentions")
    ca = _maps(d["cross_attentions"], name, "cross_attentions")
    Ld, Hd, T, T2 = da.shape
    if T != T2 or ca.shape != (Ld, Hd, T, S):
        raise _damaged(name, f"decoder maps {da.shape} and cross-attention {ca.shape} do not fit {S} source tokens")
    return {"decoder_attentions": da, "cross_attentions": ca,
            "decoder_tokens": _strings(d["decoder_tokens"], name, "decoder_tokens", T),
            "decoder_special": _flags(d["decoder_special"], name, "decoder_special", T)}


def _view(d: dict[str, np.ndarray], name: str) -> dict:
    """The view the window saved the file from ({} when absent)."""
    if "view" not in d:
        return {}
    v = d["view"]
    try:
        view = json.loads(str(v)) if v.dtype.kind == "U" and v.ndim == 0 else None
    except json.JSONDecodeError:
        view = None
    if not isinstance(view, dict):
        raise _damaged(name, "its view is not a JSON object")
    return view


def info_for_result(r: RunResult, label: str = "") -> ModelInfo:
    """A ModelInfo for a result whose model is not loaded: sizes from its arrays, the rest unknown."""
    L, H, N, _ = r.attentions.shape
    where = f"opened from {label}" if label else "a result opened without its model"
    image = r.grid is not None
    patch = None
    if image and r.image is not None and r.grid[0]:
        patch = max(1, r.image.shape[0] // r.grid[0])
    causal = bool(N > 1 and not np.triu(r.attentions[:, :, :, :], 1).any())
    dec = r.decoder_attentions
    return ModelInfo(name=r.model, family="saved run", modality="image" if image else "text", num_layers=L,
                     num_heads=H, hidden_size=0, max_positions=N, device="none", dtype="float32", trained=True,
                     causal=causal, note=f"{where}: the saved maps of {r.model}; the model is not loaded",
                     patch_size=patch, image_size=None if r.image is None else int(r.image.shape[0]),
                     min_tokens=1, encoder_decoder=dec is not None,
                     decoder_layers=0 if dec is None else dec.shape[0],
                     decoder_heads=0 if dec is None else dec.shape[1])


def saved_run_of(result: RunResult, label: str = "") -> SavedRun:
    """A RunResult in memory (ax.open(result)) as a SavedRun, checked as a file's arrays would be."""
    if not isinstance(result, RunResult):
        raise UserError(f"ax.open takes a RunResult or the path of a saved run (.npz), not {type(result).__name__}")
    from attn_explorer.files import result_arrays

    arrays = result_arrays(result)
    if result.decoder_attentions is not None and result.cross_attentions is not None:
        arrays.update(decoder_attentions=result.decoder_attentions, cross_attentions=result.cross_attentions,
                      decoder_tokens=np.asarray(list(result.decoder_tokens), dtype=np.str_),
                      decoder_special=np.asarray(result.decoder_special, dtype=bool))
    run = _from_arrays(arrays, label or "the result")
    run.result.forward_ms, run.result.notes = float(result.forward_ms), list(result.notes)
    run.result.patch_offset = int(result.patch_offset) if result.grid is not None else 0
    run.info = info_for_result(run.result, label)
    return run


def tokens_text(tokens: list[str], special) -> str:
    """The words a run's tokens spell, for the text box of a saved run that did not record its text:
    special tokens dropped, WordPiece "##" pieces and unmarked byte-level/SentencePiece pieces joined to
    the word before (a reading of the tokens, not necessarily the exact text that was typed)."""
    plain = [t for t, s in zip(tokens, special) if not s]
    marked = any(t[:1] in ("Ġ", "▁") for t in plain)  # byte-level BPE / SentencePiece: a mark starts a word
    words: list[str] = []
    for t in plain:
        if t.startswith("##") and words:
            words[-1] += t[2:]
        elif marked and t[:1] in ("Ġ", "▁"):
            words.append(t[1:])
        elif marked and words:
            words[-1] += t.replace("Ċ", "\n")
        else:
            words.append(t)
    return " ".join(w for w in words if w)
