"""A tiny GPT-2 whose heads are set by hand: layer 0 head 0 a previous-token head, layer 1 head 0 an induction
head that copies (its OV circuit writes the attended token's own embedding), the other two heads zero (uniform
attention, no output), every MLP zero. Saved as a Hugging Face folder with a word-level tokenizer, loaded by
ax.load_model like any other folder.

The residual stream (D = 128) is laid out by hand: dims 0..23 the token (one-hot), 24..87 the position
(one-hot, 64 positions), 88..111 the previous token, written by the previous-token head."""
from __future__ import annotations

from pathlib import Path

WORDS = ["[UNK]"] + ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
                     "oscar papa quebec romeo sierra tango uniform victor whiskey").split()
V, P, D = len(WORDS), 64, 128
POS, PREV = V, V + P  # where the position and the previous token live
PREV_HEAD, INDUCTION_HEAD = (0, 0), (1, 0)


def make_planted_folder(folder: Path) -> Path:
    assert V == 24 and PREV + V <= D
    model, sd = one_hot_gpt2(V, POS)
    d = D // 2  # d_head
    # layer 0 head 0: query = its position p, key = position j as p + 1: q_i . k_j is large when j = i - 1.
    w = sd["transformer.h.0.attn.c_attn.weight"]  # (D, 3D): x @ w = [q | k | v], head h in columns h*d..h*d+d-1
    for p in range(P - 1):
        w[POS + p, p] = 1.5
        w[POS + p, D + p + 1] = 1.0
    for t in range(V):  # value: the token; output: into the previous-token slot
        w[t, 2 * D + t] = 1.0
    proj = sd["transformer.h.0.attn.c_proj.weight"]  # (D, D): z @ proj, head 0's z in rows 0..d-1
    for t in range(V):
        proj[t, PREV + t] = 0.15
    # layer 1 head 0: query = the token, key = the previous token: attends to the token after an earlier copy
    w = sd["transformer.h.1.attn.c_attn.weight"]
    for t in range(V):
        w[t, t] = 2.0
        w[PREV + t, D + t] = 1.0
        w[t, 2 * D + t] = 1.0  # value: the token itself ...
    proj = sd["transformer.h.1.attn.c_proj.weight"]
    for t in range(V):
        proj[t, t] = 1.0  # ... written back as that token's embedding: it raises the attended token's logit
    assert d >= P
    return save_planted(model, sd, folder, WORDS)


def one_hot_gpt2(vocab: int, pos: int, eos_token_id: int | None = None):
    """A 2-layer, 2-head GPT-2 (P positions, D dims, tied embeddings, no dropout) and a state dict for it that is
    zero but for the one-hot token embedding (token t at dim t), the one-hot position embedding (position p at dim
    pos + p) and unit LayerNorm weights; the heads are left to the caller, then save_planted."""
    import torch
    import transformers

    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=P, n_embd=D, n_layer=2, n_head=2, n_inner=4 * D,
                                  activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos_token_id)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for t in range(vocab):
        sd["transformer.wte.weight"][t, t] = 1.0
    for p in range(P):
        sd["transformer.wpe.weight"][p, pos + p] = 1.0
    for i in range(2):
        for ln in ("ln_1", "ln_2"):
            sd[f"transformer.h.{i}.{ln}.weight"].fill_(1.0)
    sd["transformer.ln_f.weight"].fill_(1.0)
    return model, sd


def save_planted(model, sd, folder: Path, words: list[str], special: tuple[str, ...] = ()) -> Path:
    """sd loaded into model, saved to folder as a Hugging Face folder with a word-level tokenizer over words
    (whitespace split, [UNK] for the rest; special added as special tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    if "lm_head.weight" in sd:  # tied: the same tensor as the embedding, not a second (zero) one loaded after it
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model.load_state_dict(sd)
    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if special:
        tok.add_special_tokens(list(special))
    tok.save(str(folder / "tokenizer.json"))
    return folder


def repeated_documents(n: int = 12, half: int = 30, seed: int = 0) -> list[str]:
    """n documents, each `half` random words and then the same words again (2 * half <= 64 tokens)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        words = [WORDS[i] for i in rng.integers(1, V, size=half)]
        docs.append(" ".join(words + words))
    return docs
