"""Encoder-decoder runs (BART): the target text made into the decoder's input, and the decoder's
self-attention and cross-attention maps put beside the encoder's in a RunResult."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.budget import attention_maps_bytes, default_budget, human_bytes
from attn_explorer.errors import UserError
from attn_explorer.validate import finite_attention, text_size_ok, visible_text


@dataclass
class DecoderInput:
    tokens: list[str]  # what the decoder reads: the start token, then the target without its last token
    special: list[bool]


def prepare_target(model, prep, target: str | None, max_tokens: int | None = None) -> DecoderInput | None:
    """Put the decoder's input ids in prep.inputs (and its notes in prep.notes). None for a model without
    a decoder; a target given to one is one line. No target: the decoder reads the source, as
    transformers' BART does by default."""
    if not model.info.encoder_decoder:
        if target is not None:
            raise UserError(f"{model.info.name} has no decoder: a target text needs an encoder-decoder model "
                            "(BART)")
        return None
    if target is None:
        ids, tokens, special = prep.inputs["input_ids"][0].tolist(), list(prep.tokens), list(prep.special)
    else:
        if not isinstance(target, str):
            raise UserError(f"the target must be text, not {type(target).__name__}")
        text_size_ok(target)
        visible_text(target)
        limit = model.info.max_positions if max_tokens is None else min(model.info.max_positions, int(max_tokens))
        enc = model.tokenizer.encode(target, limit)
        ids, tokens, special = enc.ids, enc.tokens, enc.special
        if enc.truncated:
            prep.notes.append(f"target truncated to its first {len(ids)} tokens")
    _check_memory(model, len(prep.tokens), len(ids))
    start = model.module.cfg.decoder_start_token_id
    prep.inputs["decoder_input_ids"] = torch.tensor([[start] + ids[:-1]], device=model.device)
    return DecoderInput(model.tokenizer.display([start]) + tokens[:-1], [True] + special[:-1])


def _check_memory(model, s: int, t: int) -> None:
    """Refuse, before running, maps that would not fit: the encoder's L·H·S² and the decoder's
    L_dec·H_dec·(T² + T·S) weights together, in the budget Model.run uses for one stack."""
    i = model.info
    elem = model.dtype.itemsize + (0 if model.dtype == torch.float32 else 4)
    need = attention_maps_bytes(s, i.num_layers, i.num_heads, elem=elem)
    need += i.decoder_layers * i.decoder_heads * (t * t + t * s) * elem
    budget = default_budget(model.device)
    if need > budget:
        raise UserError(f"{s:,} source and {t:,} target tokens would need {human_bytes(need)} for the encoder's, "
                        f"decoder's and cross-attention maps; only {human_bytes(budget)} can be spared now: "
                        "use shorter texts")


def result_fields(out, dec: DecoderInput, hidden: bool) -> dict:
    """RunResult's decoder fields from the module's output (batch of one); NaN is refused."""
    def maps(t):
        return np.ascontiguousarray(finite_attention(t[0].float().cpu().numpy()), dtype=np.float32)

    return dict(
        decoder_tokens=dec.tokens, decoder_special=np.asarray(dec.special, dtype=bool),
        decoder_attentions=maps(out.decoder_attentions), cross_attentions=maps(out.cross_attentions),
        decoder_hidden=out.decoder_hidden[0].float().cpu().numpy() if hidden else None,
    )
