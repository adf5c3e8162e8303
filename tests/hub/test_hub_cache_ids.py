"""A hub id of every supported family loads from a filled Hugging Face cache, offline: the cache is built
under a temporary HF_HOME in the hub's own layout (models--org--name/blobs, snapshots/<rev>/ as links to the
blobs, refs/main), with the weights in several shards and a chat_template.jinja among the files, and
`ax.load_model("org/name")` reads it with HF_HUB_OFFLINE=1.

FAMILIES is the list to extend when a family is added to hub/families/ (the families committed
there when this was written are all in it)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
hf_constants = pytest.importorskip("huggingface_hub.constants")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.hub.families import ARCHITECTURES  # noqa: E402
from tests.tiny_llama import CHAT_TEMPLATE, train_tokenizer  # noqa: E402

T = transformers
TEXT_COMMON = dict(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                   max_position_embeddings=64, attn_implementation="eager")
IMAGE_COMMON = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=48, attn_implementation="eager")

# model_type -> a tiny random transformers model of that family (extend when a family is added).
FAMILIES = {
    "bert": lambda: T.BertModel(T.BertConfig(**TEXT_COMMON)),
    "roberta": lambda: T.RobertaModel(T.RobertaConfig(pad_token_id=1, type_vocab_size=1, **TEXT_COMMON)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=320, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                   attn_implementation="eager")),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False,
                                                      **TEXT_COMMON)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(vocab_size=320, hidden_size=32, num_hidden_layers=2, ffn_dim=48,
                                                num_attention_heads=4, max_position_embeddings=64,
                                                word_embed_proj_dim=32, attn_implementation="eager")),
    "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=320, dim=32, n_layers=2, n_heads=4,
                                                               hidden_dim=48, max_position_embeddings=64,
                                                               attn_implementation="eager")),
    "electra": lambda: T.ElectraModel(T.ElectraConfig(embedding_size=16, **TEXT_COMMON)),
    "vit": lambda: T.ViTModel(T.ViTConfig(**IMAGE_COMMON)),
    "deit": lambda: T.DeiTModel(T.DeiTConfig(**IMAGE_COMMON)),
    "dinov2": lambda: T.Dinov2Model(T.Dinov2Config(**IMAGE_COMMON)),
}


def test_every_listed_family_is_one_the_loader_reads():
    assert set(FAMILIES) <= set(ARCHITECTURES)


def _fill_cache(hub_cache: Path, repo_id: str, files: Path, rev: str = "0" * 40) -> None:
    """files laid out as the hub cache holds a download: content-addressed blobs, a snapshot of links."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in sorted(files.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)


@pytest.fixture
def offline_home(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these at import; snapshot_download reads the constants at call time.
    monkeypatch.setattr(hf_constants, "HF_HOME", str(home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return home / "hub"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_hub_id_of_each_family_loads_from_the_cache_offline(family, tmp_path, offline_home):
    torch.manual_seed(0)
    hf = FAMILIES[family]().eval()
    saved = tmp_path / "saved"
    hf.save_pretrained(saved, safe_serialization=True, max_shard_size="20KB")
    index = json.loads((saved / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3  # chunked
    text = hf.config.model_type not in ("vit", "deit", "dinov2")
    if text:
        train_tokenizer().save(str(saved / "tokenizer.json"))
        (saved / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    repo_id = f"tiny-org/{family}-tiny"
    _fill_cache(offline_home, repo_id, saved)

    m = ax.load_model(repo_id, device="cpu")
    assert m.info.family == family and m.info.num_layers == 2 and m.info.name == repo_id
    if text:
        assert m.tokenizer.chat_template == CHAT_TEMPLATE
        r = m.run("The capital of France is Paris.")
    else:
        from PIL import Image

        r = m.run(Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)))
    assert r.attentions.shape[:2] == (2, 4) and np.isfinite(r.attentions).all()


def test_an_id_missing_from_the_offline_cache_is_one_line(offline_home):
    offline_home.mkdir(parents=True)
    with pytest.raises(UserError) as e:
        ax.load_model("tiny-org/not-there", device="cpu")
    assert "not in the local Hugging Face cache" in str(e.value) and "\n" not in str(e.value)
