"""Text encoders: BERT (MiniLM), RoBERTa (XLM-R, CamemBERT), DistilBERT, ELECTRA: post-LN, learned positions."""
from __future__ import annotations

import dataclasses

from attn_explorer.core.encoder import EncoderConfig, TextEncoder
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, B as _B, Architecture, act, norm_eps, width

# ---- BERT family (BERT, MiniLM, RoBERTa): post-LN encoders -------------------------------------

def _encoder_config(cfg: dict) -> EncoderConfig:
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"position_embedding_type {cfg['position_embedding_type']!r} is not supported (only absolute)")
    roberta = cfg.get("model_type") in ("roberta", "xlm-roberta", "camembert")
    return EncoderConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], mlp_hidden=cfg["intermediate_size"],
        max_positions=cfg["max_position_embeddings"], type_vocab_size=cfg.get("type_vocab_size", 2),
        eps=norm_eps(cfg, "layer_norm_eps", 1e-12), act=act(cfg), pad_token_id=cfg.get("pad_token_id") or 0,
        position_offset=(cfg.get("pad_token_id") or 0) + 1 if roberta else 0,
    )


_L = r"encoder\.layer\.(\d+)\."
ENCODER_RULES = [
    (r"embeddings\.word_embeddings\.(weight)", r"embeddings.word.\1"),
    (r"embeddings\.position_embeddings\.(weight)", r"embeddings.position.\1"),
    (r"embeddings\.token_type_embeddings\.(weight)", r"embeddings.token_type.\1"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.norm.\1"),
    (_L + r"attention\.self\.(query|key|value)\.(weight|bias)", _B + r"attn.\2.\3"),
    (_L + r"attention\.output\.dense\.(weight|bias)", _B + r"attn.out.\2"),
    (_L + r"attention\.output\.LayerNorm\.(weight|bias)", _B + r"norm1.\2"),
    (_L + r"intermediate\.dense\.(weight|bias)", _B + r"mlp.fc1.\2"),
    (_L + r"output\.dense\.(weight|bias)", _B + r"mlp.fc2.\2"),
    (_L + r"output\.LayerNorm\.(weight|bias)", _B + r"norm2.\2"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
]
TEXT_HEADS = (r"cls\..*", r"lm_head\..*", r"classifier\..*", r"qa_outputs\..*", r"embeddings\.position_ids",
              r"embeddings\.token_type_ids")

# ---- DistilBERT: BERT's post-LN encoder without token types, other names -------------------------

def _distilbert_config(cfg: dict) -> EncoderConfig:
    # sinusoidal_pos_embds: DistilBERT fills its position table with sin/cos once and saves it like a
    # learned one, so both kinds are read from the checkpoint's embeddings.position_embeddings.weight.
    return EncoderConfig(
        vocab_size=cfg["vocab_size"], dim=cfg["dim"], num_layers=cfg["n_layers"], num_heads=cfg["n_heads"],
        mlp_hidden=cfg["hidden_dim"], max_positions=cfg["max_position_embeddings"], type_vocab_size=0,
        eps=1e-12, act=act(cfg, "activation"), pad_token_id=cfg.get("pad_token_id") or 0,
    )


_DL = r"transformer\.layer\.(\d+)\."
DISTILBERT_RULES = [
    (r"embeddings\.word_embeddings\.(weight)", r"embeddings.word.\1"),
    (r"embeddings\.position_embeddings\.(weight)", r"embeddings.position.\1"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.norm.\1"),
    (_DL + r"attention\.q_lin\.(weight|bias)", _B + r"attn.query.\2"),
    (_DL + r"attention\.k_lin\.(weight|bias)", _B + r"attn.key.\2"),
    (_DL + r"attention\.v_lin\.(weight|bias)", _B + r"attn.value.\2"),
    (_DL + r"attention\.out_lin\.(weight|bias)", _B + r"attn.out.\2"),
    (_DL + r"sa_layer_norm\.(weight|bias)", _B + r"norm1.\2"),
    (_DL + r"ffn\.lin(1|2)\.(weight|bias)", _B + r"mlp.fc\2.\3"),
    (_DL + r"output_layer_norm\.(weight|bias)", _B + r"norm2.\2"),
]
DISTILBERT_NAMES = {"num_layers": "n_layers", "num_heads": "n_heads", "mlp_hidden": "hidden_dim",
                    "max_positions": "max_position_embeddings"}

# ---- ELECTRA (the discriminator or the generator's encoder): BERT with narrower embeddings --------

def _electra_config(cfg: dict) -> EncoderConfig:
    return dataclasses.replace(_encoder_config(cfg), embed_dim=width(cfg, "embedding_size", cfg["hidden_size"]))


ARCHITECTURES.update({
    "bert": Architecture("bert", "text", TextEncoder, _encoder_config, ENCODER_RULES, ("bert.",), TEXT_HEADS),
    "roberta": Architecture("roberta", "text", TextEncoder, _encoder_config, ENCODER_RULES, ("roberta.",), TEXT_HEADS),
    "distilbert": Architecture(
        "distilbert", "text", TextEncoder, _distilbert_config, DISTILBERT_RULES, ("distilbert.",),
        ignore=TEXT_HEADS + (r"vocab_(transform|layer_norm|projector)\..*", r"pre_classifier\..*"),
        names=DISTILBERT_NAMES,
    ),
    "electra": Architecture(
        "electra", "text", TextEncoder, _electra_config,
        ENCODER_RULES + [(r"embeddings_project\.(weight|bias)", r"embeddings.project.\1")], ("electra.",),
        ignore=TEXT_HEADS + (r"(discriminator|generator)_predictions\..*", r"generator_lm_head\..*"),
    ),
})
# Same layout, other names.
for alias, target in {"xlm-roberta": "roberta", "camembert": "roberta"}.items():
    ARCHITECTURES[alias] = ARCHITECTURES[target]
