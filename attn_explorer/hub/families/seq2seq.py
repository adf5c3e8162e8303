"""Encoder-decoders: BART (a post-LN encoder, a decoder with cross-attention, positions offset by 2)."""
from __future__ import annotations

from attn_explorer.core.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, Architecture, act

BART_DEFAULTS = dict(vocab_size=50265, d_model=1024, encoder_layers=12, decoder_layers=12,
                     encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                     decoder_ffn_dim=4096, max_position_embeddings=1024, activation_function="gelu",
                     scale_embedding=False, pad_token_id=1, decoder_start_token_id=2)


def _bart_config(cfg: dict) -> EncoderDecoderConfig:
    c = {**BART_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    if c.get("normalize_before") or c.get("add_final_layer_norm"):
        raise UserError("BART with normalize_before or add_final_layer_norm (pre-LN, mBART-style) is not supported")
    if isinstance(c["decoder_attention_heads"], int) and c["decoder_attention_heads"] >= 1 \
            and c["d_model"] % c["decoder_attention_heads"]:
        raise UserError(f"d_model {c['d_model']} is not divisible by decoder_attention_heads "
                        f"{c['decoder_attention_heads']} (each head gets an equal share of the width)")
    return EncoderDecoderConfig(
        vocab_size=c["vocab_size"], dim=c["d_model"], num_layers=c["encoder_layers"],
        num_heads=c["encoder_attention_heads"], mlp_hidden=c["encoder_ffn_dim"], decoder_layers=c["decoder_layers"],
        decoder_heads=c["decoder_attention_heads"], decoder_mlp_hidden=c["decoder_ffn_dim"],
        max_positions=c["max_position_embeddings"], act=act(c, "activation_function"),
        scale_embedding=c["scale_embedding"], pad_token_id=c["pad_token_id"],
        decoder_start_token_id=c["decoder_start_token_id"],
    )


_BE, _BD = r"encoder\.layers\.(\d+)\.", r"decoder\.layers\.(\d+)\."
_QKVO = {"q": "query", "k": "key", "v": "value", "out": "out"}
BART_RULES = [
    (r"shared\.weight", "embed_tokens.weight"),
    (r"(encoder|decoder)\.embed_positions\.weight", r"\1.embed_positions.weight"),
    (r"(encoder|decoder)\.layernorm_embedding\.(weight|bias)", r"\1.embed_norm.\2"),
    *[(_BE + rf"self_attn\.{hf}_proj\.(weight|bias)", rf"encoder.blocks.layers.\1.attn.{ours}.\2")
      for hf, ours in _QKVO.items()],
    (_BE + r"self_attn_layer_norm\.(weight|bias)", r"encoder.blocks.layers.\1.norm1.\2"),
    (_BE + r"fc(1|2)\.(weight|bias)", r"encoder.blocks.layers.\1.mlp.fc\2.\3"),
    (_BE + r"final_layer_norm\.(weight|bias)", r"encoder.blocks.layers.\1.norm2.\2"),
    *[(_BD + rf"self_attn\.{hf}_proj\.(weight|bias)", rf"decoder.layers.\1.self_attn.{ours}.\2")
      for hf, ours in _QKVO.items()],
    *[(_BD + rf"encoder_attn\.{hf}_proj\.(weight|bias)", rf"decoder.layers.\1.cross_attn.{ours}.\2")
      for hf, ours in _QKVO.items()],
    (_BD + r"self_attn_layer_norm\.(weight|bias)", r"decoder.layers.\1.norm1.\2"),
    (_BD + r"encoder_attn_layer_norm\.(weight|bias)", r"decoder.layers.\1.norm_cross.\2"),
    (_BD + r"fc(1|2)\.(weight|bias)", r"decoder.layers.\1.mlp.fc\2.\3"),
    (_BD + r"final_layer_norm\.(weight|bias)", r"decoder.layers.\1.norm2.\2"),
]
# Both stacks read `shared` (older checkpoints also store tied copies under each stack); the LM head is
# the same table, its bias and the task heads are not read (no generation here).
BART_IGNORE = (r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight", r"final_logits_bias",
               r"classification_head\..*", r"qa_outputs\..*")
ARCHITECTURES["bart"] = Architecture("bart", "text", EncoderDecoder, _bart_config, BART_RULES, ("model.",),
                                     BART_IGNORE)
