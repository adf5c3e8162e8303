"""The lab's results as one .npz (issue 27 B), written by the Lab page's "Save results…" and the `retrieval`
command, read back without the model by the page's "Open results…".

An induction file holds what `python main.py induction` writes (`induction` (L, H), model, seq_len, batches,
seed) and a retrieval file what `retrieval` writes (`retrieval` (L, H), accuracy (lengths, depths) with
`lengths` and `depths`, `actual_tokens` (the prompt tokens read per length and depth), the answers); both
add `heads_ranked`, the check's figures (`check_clean`, `check_top`, `check_top_heads`, `check_random`,
`check_random_heads`) where a check was run, and the settings (`setting_<name>`: the needle, question and
answer, tokens generated, ...). So the commands' files open on the page too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attn_explorer.analysis.atlas_induction import InductionScores
from attn_explorer.analysis.lab import AblationCheck, ranked_heads
from attn_explorer.analysis.lab_retrieval import RetrievalResult
from attn_explorer.errors import UserError

LAB_VERSION = 1
WHAT = {"induction": "loss on the repeat (nats/token)", "retrieval": "needle accuracy"}


@dataclass
class LabResults:
    """One saved result: its kind ("induction" | "retrieval"), the scores object, its check (or None), the
    settings it was made with, and the model's name."""

    kind: str
    result: InductionScores | RetrievalResult
    check: AblationCheck | None
    settings: dict

    @property
    def model(self) -> str:
        return self.result.model


def check_arrays(check: AblationCheck | None) -> dict[str, np.ndarray]:
    if check is None:
        return {}
    return {"check_clean": np.array(float(check.clean)), "check_top": np.array(float(check.top)),
            "check_top_heads": np.array(check.top_heads, dtype=np.int64).reshape(-1, 2),
            "check_random": np.array(check.random, dtype=np.float64),
            "check_random_heads": np.array(check.random_heads, dtype=np.int64).reshape(len(check.random), -1, 2)}


def _heads(a) -> list[tuple[int, int]]:
    return [(int(l), int(h)) for l, h in np.asarray(a, dtype=np.int64).reshape(-1, 2)]


def _check(d: dict, model: str, kind: str) -> AblationCheck | None:
    if "check_clean" not in d:
        return None
    random = [float(v) for v in np.asarray(d["check_random"], dtype=np.float64).ravel()]
    sets = np.asarray(d["check_random_heads"], dtype=np.int64).reshape(len(random), -1, 2)
    return AblationCheck(model, WHAT[kind], float(d["check_clean"]), _heads(d["check_top_heads"]),
                         float(d["check_top"]), [_heads(s) for s in sets], random,
                         higher_is_worse=kind == "induction")


def results_arrays(result, check: AblationCheck | None = None, settings: dict | None = None) -> dict:
    """Every array of the file: the result's own, the ranked heads, the check's figures and the settings."""
    kind = "induction" if isinstance(result, InductionScores) else "retrieval"
    out = dict(result.arrays())
    out.update(lab_version=np.array(LAB_VERSION), lab_kind=np.array(kind),
               heads_ranked=np.array(ranked_heads(result.scores), dtype=np.int64).reshape(-1, 2))
    out.update(check_arrays(check))
    for k, v in (settings or {}).items():
        out[f"setting_{k}"] = np.array(v)
    return out


def save_results(path, result, check: AblationCheck | None = None, settings: dict | None = None) -> Path:
    """Write one .npz atomically (files.atomic_write: a failure leaves no file, an old one as it was)."""
    from attn_explorer.files import atomic_write

    arrays = results_arrays(result, check, settings)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    return atomic_write(path, write)


def _setting(v: np.ndarray):
    v = v.item() if v.ndim == 0 else v.tolist()
    return v


def _retrieval(d: dict, model: str) -> RetrievalResult:
    scores = np.asarray(d["retrieval"], dtype=np.float64)
    acc = np.asarray(d["accuracy"], dtype=np.float64)
    lengths = [int(n) for n in np.asarray(d["lengths"]).ravel()]
    depths = [float(x) for x in np.asarray(d["depths"]).ravel()]
    if scores.ndim != 2 or acc.shape != (len(lengths), len(depths)):
        raise ValueError(f"accuracy is shaped {acc.shape}, not ({len(lengths)}, {len(depths)}) lengths × depths")
    actual = None
    if "actual_tokens" in d:
        actual = np.asarray(d["actual_tokens"], dtype=np.int64)
        if actual.shape != acc.shape:
            raise ValueError(f"actual_tokens is shaped {actual.shape}, not {acc.shape}")
    texts = [str(t) for t in d.get("answers", np.array([], dtype=str)).ravel()]
    right = [bool(c) for c in d.get("correct", np.zeros(len(texts), dtype=bool)).ravel()]
    if "answer_lengths" in d:
        at = list(zip((int(n) for n in d["answer_lengths"]), (float(x) for x in d["answer_depths"])))
    else:  # the command answers every length at every depth, in that order
        at = [(n, x) for n in lengths for x in depths]
    if not (len(texts) == len(right) == len(at)):
        raise ValueError("the answers do not match the lengths and depths")
    answers = [(n, x, t, c) for (n, x), t, c in zip(at, texts, right)]
    return RetrievalResult(model, lengths, depths, acc, scores, int(d.get("copied", 0)), answers, actual)


def load_results(path) -> LabResults:
    """A file written by `save_results`, `induction` or `retrieval`, without the model; a missing, unreadable
    or damaged file is one UserError line."""
    p = os.fspath(path)
    name = os.path.basename(p)
    if not os.path.isfile(p):
        raise UserError(f"no such file: {p}")
    try:
        with np.load(p, allow_pickle=False) as z:
            d = {k: z[k] for k in z.files}
    except Exception as e:  # a truncated zip, not an npz, unreadable  # noqa: BLE001
        raise UserError(f"{name} is not a readable .npz ({type(e).__name__})") from None
    kind = str(d["lab_kind"]) if "lab_kind" in d else ("retrieval" if "retrieval" in d and "accuracy" in d else
                                                        "induction" if "induction" in d else None)
    if kind not in WHAT:
        raise UserError(f"{name} holds no lab results (saved by the Lab page, `induction` or `retrieval`)")
    try:
        model = str(d["model"])
        if kind == "induction":
            scores = np.asarray(d["induction"], dtype=np.float64)
            result = InductionScores(model, scores, int(d.get("seq_len", 0)), int(d.get("batches", 0)),
                                     int(d.get("seed", 0)))
        else:
            result = _retrieval(d, model)
        if result.scores.ndim != 2 or result.scores.size == 0:
            raise ValueError(f"the scores are shaped {result.scores.shape}, not (layers, heads)")
        check = _check(d, model, kind)
        for l, h in (check.top_heads + [x for s in check.random_heads for x in s]) if check else []:
            if not (0 <= l < result.scores.shape[0] and 0 <= h < result.scores.shape[1]):
                raise ValueError(f"the check names L{l} H{h}, outside the scores")
        settings = {k[len("setting_"):]: _setting(v) for k, v in d.items() if k.startswith("setting_")}
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise UserError(f"{name} holds damaged lab results: {str(e).splitlines()[0] if str(e) else e!r}") from None
    return LabResults(kind, result, check, settings)
