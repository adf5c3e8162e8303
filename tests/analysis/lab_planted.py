"""A tiny GPT-2 built for the retrieval lab (issue 27 B): one head, layer 1 head 1, is a pure retrieval head;
no other head copies anything from the needle. Built by hand as tests/analysis/atlas_planted builds its model
(the same words, one-hot residual layout and word-level tokenizer), plus a special [EOS] that ends an answer.

Residual stream (D = 128): dims 0..24 the token (one-hot; 24 is [EOS]), 25..88 the position (one-hot, 64
positions), 89..113 a scratch copy of the previous token, 127 a constant (layer 1's norm bias). The heads:
- L0 H0, previous-token: attends to the position before; writes that token into the scratch dims (never read
  by the logits: the unembedding is the tied one-hot embedding, which reads dims 0..24 only).
- L0 H1, self: attends to its own position; where that token is a secret, writes [EOS]: an answer ends after
  one secret token.
- L1 H0, sink: attends to position 0; writes nothing.
- L1 H1, retrieval: its query is the answer marker (the question's last word), its keys the secret words, so
  from the answer position it attends to the secret inside the needle (the only one in the prompt: the filler
  is [UNK]); its OV circuit writes that token's own embedding, which raises its logit. Elsewhere its query is
  empty (near uniform attention) and what it writes is too small to win.
So the model answers the needle's secret, then [EOS]; with L1 H1 off it repeats the marker and never answers.
"""
from __future__ import annotations

from pathlib import Path

from tests.analysis.atlas_planted import WORDS as BASE_WORDS, one_hot_gpt2, save_planted

WORDS = [*BASE_WORDS, "[EOS]"]
V, P, D = len(WORDS), 64, 128
EOS = V - 1
POS, SCRATCH = V, V + P
CONST = D - 1  # layer 1's norm writes 1 here at every position (its bias): the sink head's query
SECRETS = ("kilo", "lima", "mike", "november")
MARKER = "romeo"  # the question ends with it: the answer position
PREV_HEAD, SELF_HEAD, SINK_HEAD, RETRIEVAL_HEAD = (0, 0), (0, 1), (1, 0), (1, 1)
NEEDLE, QUESTION, ANSWER = "tango sierra kilo", "quebec romeo", "kilo"


def make_retrieval_folder(folder: Path) -> Path:
    assert SCRATCH + V <= CONST and all(w in WORDS for w in (*SECRETS, MARKER))
    model, sd = one_hot_gpt2(V, POS, eos_token_id=EOS)
    d = D // 2  # d_head; head h's q, k, v columns: h*d.., D + h*d.., 2D + h*d..; its c_proj rows h*d..
    secret = [WORDS.index(w) for w in SECRETS]
    marker = WORDS.index(MARKER)
    w0, o0 = sd["transformer.h.0.attn.c_attn.weight"], sd["transformer.h.0.attn.c_proj.weight"]
    for p in range(P - 1):  # L0 H0: query position p, key position p + 1 -> the previous position
        w0[POS + p, p] = 1.5
        w0[POS + p, D + p + 1] = 1.0
    for t in range(V):  # ... its value the token, written to the scratch dims
        w0[t, 2 * D + t] = 1.0
        o0[t, SCRATCH + t] = 0.15
    for p in range(P):  # L0 H1: query and key both the position -> itself
        w0[POS + p, d + p] = 1.5
        w0[POS + p, D + d + p] = 1.0
    for t in secret:  # ... a secret's value -> [EOS]
        w0[t, 2 * D + d] = 1.0
    o0[d, EOS] = 0.5
    w1, o1 = sd["transformer.h.1.attn.c_attn.weight"], sd["transformer.h.1.attn.c_proj.weight"]
    sd["transformer.h.1.ln_1.bias"][CONST] = 1.0  # a constant dim after layer 1's norm ...
    w1[CONST, 0] = 5.0  # ... L1 H0's query, the same everywhere; the key of position 0 -> position 0; no value
    w1[POS, D] = 1.5
    w1[marker, d] = 5.0  # L1 H1: the marker asks ...
    for t in secret:
        w1[t, D + d] = 1.0  # ... every secret answers ...
        w1[t, 2 * D + d + t] = 1.0  # ... and its value is the token itself,
        o1[d + t, t] = 2.0  # written back as its embedding: its logit rises
    assert d >= max(P, V)
    return save_planted(model, sd, folder, WORDS, special=("[EOS]",))
