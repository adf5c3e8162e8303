"""The stacks of a run's maps: an encoder-decoder (BART) has three (encoder, decoder, cross), others one.

Plain data on NumPy, no Qt: the job functions (session.jobs, in worker threads) pool the stack a page
shows, and the session's input state (session.inputs) keeps which one that is; both import it from here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_explorer.api.result import RunResult

# which attention of an encoder-decoder (BART) the explorer pages draw; other models have only "encoder"
STACKS = ("encoder", "decoder", "cross")
STACK_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention (causal)",
               "cross": "cross-attention (target → source)"}


@dataclass(frozen=True)
class StackMaps:
    """One stack of a run's maps with the tokens of each axis: rows are the queries, columns the keys.
    Encoder and decoder maps are square; cross-attention's rows are the target's tokens and its columns
    the source's."""

    stack: str  # "encoder", "decoder" or "cross"
    attentions: np.ndarray  # float32 (L, H, R, C)
    rows: list[str]  # R query tokens
    cols: list[str]  # C key tokens
    row_special: np.ndarray  # bool (R,)
    col_special: np.ndarray  # bool (C,)

    @property
    def name(self) -> str:
        return STACK_NAMES[self.stack]

    @property
    def square(self) -> bool:
        return self.stack != "cross"


def short_kind(kind: str) -> str:
    """A layer kind as a grid row carries it: "local, window 512" -> "local 512", Llama 4's "local, chunk 8192"
    -> "chunk 8192", "global" -> "global"; Gemma 4's ", keys and values of layer 13" -> ", k/v of L13"; a hybrid's
    mixers (issue 25): "gated DeltaNet (implicit)" -> "DeltaNet", "Mamba-2 (implicit)" -> "Mamba-2", Qwen3.5's
    "softmax, global" -> "softmax"."""
    short = kind.replace(", window", "").replace("local, chunk", "chunk")
    short = short.replace(" (implicit)", "").replace("gated DeltaNet", "DeltaNet").replace("softmax, global", "softmax")
    return short.replace("keys and values of layer ", "k/v of L")


def stack_maps(r: RunResult, stack: str = "encoder") -> StackMaps:
    """The maps of `stack` in r; the encoder's (the only ones) when r has no decoder."""
    special = np.asarray(r.special, dtype=bool)
    if stack == "encoder" or r.decoder_attentions is None or r.cross_attentions is None:
        return StackMaps("encoder", r.attentions, list(r.tokens), list(r.tokens), special, special)
    dec = np.asarray(r.decoder_special, dtype=bool)
    if stack == "decoder":
        return StackMaps("decoder", r.decoder_attentions, list(r.decoder_tokens), list(r.decoder_tokens), dec, dec)
    return StackMaps("cross", r.cross_attentions, list(r.decoder_tokens), list(r.tokens), dec, special)
