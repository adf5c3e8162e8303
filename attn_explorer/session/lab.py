"""What the Lab page may call (issue 27 B): induction scores by repeated random tokens and their check by
ablation, retrieval heads by needle in a haystack and their check, and the parsing of the page's fields.

Every job takes the session's model first (uses_model=True) and returns plain NumPy and Python values; its
`progress(fraction, message)` is the worker's, which raises once the job is cancelled, so a cancelled job
ends at its next step and nothing arrives.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attn_explorer.analysis.atlas_induction import InductionScores
from attn_explorer.analysis.lab import AblationCheck, ranked_heads
from attn_explorer.analysis.lab_retrieval import KEY_FACT, NEEDLE, QUESTION, Haystack, RetrievalResult
from attn_explorer.errors import UserError

__all__ = ["AblationCheck", "InductionScores", "KEY_FACT", "NEEDLE", "QUESTION", "Needle", "RetrievalRun",
           "default_lengths", "field_text", "induction_check_job", "induction_job", "open_results_job",
           "parse_depths", "parse_lengths", "parse_needle", "ranked_heads", "retrieval_check_job", "retrieval_job",
           "save_results_job", "top_for"]

DEFAULT_LENGTHS = (512, 1024)
DEFAULT_DEPTHS = "0,0.5,1"
NEW_TOKENS = 8  # tokens generated per answer
SEQ_LEN, BATCHES = 50, 4  # the repeated random tokens, as the `induction` command's defaults
MAX_CASES = 60
BUNDLED = "bundled corpus"  # the filler a run here reads (the `retrieval` command may read a file)


@dataclass
class Needle:
    """The needle sentence, the question after the haystack, and the key fact a right answer contains."""

    needle: str = NEEDLE
    question: str = QUESTION
    answer: str = KEY_FACT


@dataclass
class RetrievalRun:
    """A retrieval run: its result and the haystacks it answered (the check answers them again; a run opened
    from a file has none, and its check builds them again from the needle and the filler)."""

    result: RetrievalResult
    cases: list[Haystack]
    max_new_tokens: int
    needle: Needle = field(default_factory=Needle)
    filler: str = BUNDLED

    def settings(self) -> dict:
        n = self.needle
        return {"needle": n.needle, "question": n.question, "answer": n.answer,
                "max_new_tokens": int(self.max_new_tokens), "filler": self.filler}


def field_text(text: str) -> str:
    """A needle field's text as shown: a line break as the two characters \\n (a line edit has one line)."""
    return str(text).replace("\n", "\\n")


def _from_field(text: str) -> str:
    return str(text).replace("\\n", "\n")


def check_needle(n: Needle) -> Needle:
    """n, or one UserError line: an empty needle, question or answer, or an answer the needle does not hold
    (the model can only copy it from there; compared as the answers are, ignoring case)."""
    for what, text in (("the needle", n.needle), ("the question", n.question), ("the expected answer", n.answer)):
        if not str(text).strip():
            raise UserError(f"{what} is empty: give {'the sentence hidden in the haystack' if what == 'the needle' else 'some text'}")
    if n.answer.strip().lower() not in n.needle.lower():
        raise UserError(f"the expected answer {n.answer.strip()!r} is not in the needle: the model can only copy it "
                        "from there")
    return Needle(n.needle, n.question, n.answer.strip())


def parse_needle(needle: str, question: str, answer: str) -> Needle:
    """The page's three fields (\\n in them a line break) as a checked Needle (check_needle)."""
    return check_needle(Needle(_from_field(needle), _from_field(question), _from_field(answer)))


def _numbers(text: str, name: str, kind) -> list:
    parts = [p.strip() for p in str(text).replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise UserError(f"{name}: give comma-separated numbers, got {text!r}")
    out = []
    for p in parts:
        try:
            v = kind(p)
        except ValueError:
            raise UserError(f"{name} must be comma-separated {'whole numbers' if kind is int else 'numbers'}, "
                            f"got {p!r}") from None
        if not np.isfinite(v):
            raise UserError(f"{name} must be finite numbers, got {p!r}")
        if v not in out:
            out.append(v)
    return sorted(out)


def max_length(info, new_tokens: int = NEW_TOKENS) -> int:
    """The longest haystack the model reads with its answer's new tokens."""
    return int(info.max_positions) - int(new_tokens)


def parse_lengths(text: str, info, new_tokens: int = NEW_TOKENS) -> list[int]:
    """'512,1024' -> [512, 1024]; a length past the model's positions, or bad text, is one UserError line."""
    lengths = _numbers(text, "lengths", int)
    if lengths[0] < 1:
        raise UserError(f"lengths must be positive, got {lengths[0]}")
    cap = max_length(info, new_tokens)
    if lengths[-1] > cap:
        raise UserError(f"lengths: {lengths[-1]:,} tokens + {new_tokens} new ones exceed {info.name}'s "
                        f"{info.max_positions:,} positions (at most {cap:,})")
    return lengths


def parse_depths(text: str) -> list[float]:
    """'0,0.5,1' -> [0.0, 0.5, 1.0]; one UserError line for anything outside 0..1 or not a number."""
    depths = _numbers(text, "depths", float)
    if depths[0] < 0 or depths[-1] > 1:
        raise UserError(f"depths must be from 0 (first) to 1 (last), got {text!r}")
    return depths


def default_lengths(info, new_tokens: int = NEW_TOKENS) -> str:
    """The lengths field's default: 512,1024 where the model reads them, else a half and the most it reads."""
    cap = max_length(info, new_tokens)
    fits = [n for n in DEFAULT_LENGTHS if n <= cap]
    if len(fits) == len(DEFAULT_LENGTHS):
        return ",".join(map(str, fits))
    return ",".join(str(n) for n in sorted({max(1, cap // 2), cap}))


def top_for(info, top: int) -> int:
    """How many heads a check switches off: `top`, but at most half the model's heads (the rest are the random
    sets' pool)."""
    return max(1, min(int(top), (info.num_layers * info.num_heads) // 2))


def _steps(progress, what: str):
    def step(done: int, total: int) -> None:
        if progress is not None:
            progress(done / max(1, total), f"{what} {done} / {total}")  # raises once the job is cancelled
    return step


def induction_job(model, seq_len: int = SEQ_LEN, batches: int = BATCHES, seed: int = 0,
                  progress=None) -> InductionScores:
    """Every head's induction score (analysis.atlas_induction.induction_scores, as `python main.py induction`)."""
    from attn_explorer.analysis.atlas_induction import induction_scores

    return induction_scores(model, seq_len=seq_len, batches=batches, seed=seed,
                            progress=_steps(progress, "random sequence"))


def induction_check_job(model, scores: np.ndarray, top: int, random_sets: int = 5, seed: int = 0,
                        seq_len: int = SEQ_LEN, batches: int = BATCHES, progress=None) -> AblationCheck:
    """The top induction heads off against `random_sets` random sets of as many (analysis.lab)."""
    from attn_explorer.analysis.lab import induction_ablation

    return induction_ablation(model, scores, top=top_for(model.info, top), random_sets=random_sets, seed=seed,
                              seq_len=seq_len, batches=batches, progress=_steps(progress, "condition"))


def _filler(lengths: list[int]):
    from attn_explorer.analysis.lab_retrieval import FILLER_CHARS, bundled_filler

    return bundled_filler(min(FILLER_CHARS, 20_000 + 8 * max(lengths)))


def retrieval_job(model, lengths: list[int], depths: list[float], needle: Needle | None = None,
                  max_new_tokens: int = NEW_TOKENS, progress=None) -> RetrievalRun:
    """Haystacks of every (length, depth), answered (analysis.lab_retrieval.retrieval_scores)."""
    from attn_explorer.analysis.lab_retrieval import check_decoder, retrieval_scores

    check_decoder(model)
    n = check_needle(needle or Needle())
    if len(lengths) * len(depths) > MAX_CASES:
        raise UserError(f"{len(lengths)} lengths × {len(depths)} depths make more than {MAX_CASES} haystacks")
    parse_lengths(",".join(map(str, lengths)), model.info, max_new_tokens)
    if progress is not None:
        progress(0.0, "building the haystacks")
    cases = _haystacks(model, lengths, depths, n)
    r = retrieval_scores(model, cases, max_new_tokens, progress=_steps(progress, "haystack"))
    return RetrievalRun(r, cases, int(max_new_tokens), n)


def _haystacks(model, lengths: list[int], depths: list[float], n: Needle) -> list[Haystack]:
    from attn_explorer.analysis.lab_retrieval import make_haystack

    fill = _filler(lengths)
    return [make_haystack(n.needle, n.question, fill, length, d, model.tokenizer, answer=n.answer)
            for length in lengths for d in depths]


def retrieval_check_job(model, run: RetrievalRun, top: int, random_sets: int = 5, seed: int = 0,
                        progress=None) -> AblationCheck:
    """Needle accuracy with the top retrieval heads off against random sets of as many."""
    from attn_explorer.analysis.lab_retrieval import retrieval_ablation

    if run.result.model != model.info.name:
        raise UserError(f"these retrieval scores are {run.result.model}'s, not {model.info.name}'s: run again")
    cases = run.cases
    if not cases:  # opened from a file: the same haystacks, built again
        if not run.filler:
            raise UserError("these results were saved without their needle, question and filler (an older file): "
                            "run again to check")
        if run.filler != BUNDLED:
            raise UserError(f"these results read the filler {run.filler}; the check here reads the bundled corpus: "
                            "run again")
        if progress is not None:
            progress(0.0, "building the haystacks")
        cases = _haystacks(model, run.result.lengths, run.result.depths, run.needle)
    return retrieval_ablation(model, cases, run.result.scores, top=top_for(model.info, top),
                              random_sets=random_sets, seed=seed, max_new_tokens=run.max_new_tokens,
                              progress=_steps(progress, "condition"))


# ---------------------------------------------------------------------------------------------- files
def save_results_job(result, check: AblationCheck | None, path: str) -> str:
    """Write the shown result (InductionScores or RetrievalRun) and its check to one .npz (analysis.lab_results);
    the path gets .npz where it has no such suffix."""
    from attn_explorer.analysis.lab_results import save_results

    if not str(path).lower().endswith(".npz"):
        path = f"{path}.npz"
    if isinstance(result, RetrievalRun):
        save_results(path, result.result, check, result.settings())
    else:
        save_results(path, result, check, {"check_seed": 0})
    return str(path)


def open_results_job(path: str):
    """(kind, the result as the page holds it, its check) of a saved file, without the model."""
    from attn_explorer.analysis.lab_results import load_results

    got = load_results(path)
    if got.kind == "induction":
        return got.kind, got.result, got.check
    s = got.settings
    needle = Needle(str(s.get("needle", NEEDLE)), str(s.get("question", QUESTION)), str(s.get("answer", KEY_FACT)))
    run = RetrievalRun(got.result, [], int(s.get("max_new_tokens", NEW_TOKENS)), needle,
                       str(s.get("filler", "")))  # "": not recorded (an older `retrieval` file)
    return got.kind, run, got.check
