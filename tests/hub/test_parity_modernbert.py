"""ModernBERT in our modules against transformers' ModernBertModel in eager mode, on tiny seeded random
configs saved with save_pretrained: every layer's attention map and the last hidden state within 1e-5 in
float32, with global and bidirectional local layers, two RoPE bases and random (not unit) norm weights."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity import _run_ours, linear_path  # noqa: E402,F401 - the shared fixture
from tests.tiny_llama import CORPUS  # noqa: E402

TOL = 1e-5
SPREAD = 0.3  # weights 15x HF's default spread: the GLU's inputs reach |x| ~ 1-3, where a wrong activation shows
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def modernbert_tokenizer():
    """ModernBERT's kind of tokenizer.json: byte-level BPE with [CLS] $A [SEP] added by its post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


def _config(vocab: int, **over):
    cfg = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=24,
               global_attn_every_n_layers=3, local_attention=4, max_position_embeddings=64,
               initializer_range=SPREAD, attn_implementation="eager",
               pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
    cfg.update(over)
    return transformers.ModernBertConfig(**cfg)


CASES = {
    # 3 layers, global every 3: layer 0 global, 1 and 2 local (±2); the default bases 160k / 10k
    "base": {},
    "biases": dict(attention_bias=True, mlp_bias=True, norm_bias=True),
    # 5 layers, global every 2 (0, 2, 4), windows ±3, other bases, more heads
    "every_2": dict(num_hidden_layers=5, global_attn_every_n_layers=2, local_attention=6, num_attention_heads=8,
                    global_rope_theta=500.0, local_rope_theta=50.0),
}


def _hf_model(tmp_path, case: str, vocab: int):
    torch.manual_seed(0)
    hf = transformers.ModernBertModel(_config(vocab, **CASES[case])).eval()
    with torch.no_grad():  # random norm weights (and biases): a norm left at 1 / 0, or put in the wrong place, shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * SPREAD + (1.0 if name.endswith("weight") else 0.0))
    folder = tmp_path / case
    hf.save_pretrained(folder, safe_serialization=True)
    modernbert_tokenizer().save(str(folder / "tokenizer.json"))
    return hf, folder


def _max_diff(hf_out, ours, rows=slice(None)):
    maps = max((ours.attentions[:, i, :, rows] - a[:, :, rows]).abs().max().item()
               for i, a in enumerate(hf_out.attentions))
    hidden = (ours.hidden[:, rows] - hf_out.last_hidden_state[:, rows]).abs().max().item()
    return maps, hidden


@pytest.mark.parametrize("case", list(CASES))
def test_modernbert_parity(tmp_path, case, linear_path):
    vocab = modernbert_tokenizer().get_vocab_size()
    hf, folder = _hf_model(tmp_path, case, vocab)
    m = ax.load_model(str(folder), device="cpu")
    L, every = hf.config.num_hidden_layers, CASES[case].get("global_attn_every_n_layers", 3)
    half = hf.config.local_attention // 2
    assert m.info.family == "modernbert" and not m.info.causal and m.info.num_layers == L
    assert m.info.layer_kinds == tuple("global" if i % every == 0 else f"local, window ±{half}" for i in range(L))
    ids = torch.randint(5, vocab, (2, 12))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    ours = _run_ours(m, input_ids=ids)
    assert ours.attentions.shape == (2, L, hf.config.num_attention_heads, 12, 12)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i], a, atol=TOL, rtol=0, msg=f"layer {i} attention")
        if i % every:  # a local layer: nothing outside the band
            far = (torch.arange(12)[:, None] - torch.arange(12)[None, :]).abs() > half
            assert ours.attentions[:, i][..., far].abs().max() == 0 and ours.attentions[:, i][..., ~far].min() > 0
    torch.testing.assert_close(ours.hidden, ref.last_hidden_state, atol=TOL, rtol=0)
    print(case, "max |ours - transformers| maps / hidden: %.2g / %.2g" % _max_diff(ref, ours))


def test_modernbert_parity_with_padding(tmp_path):
    """A padded sequence: padding keys get no weight in global and local layers. Real tokens' rows match;
    a padding query whose whole window is padding attends to nothing here (zeros: the house rule), where
    transformers spreads it evenly over every key, so only the real rows are compared."""
    vocab = modernbert_tokenizer().get_vocab_size()
    hf, folder = _hf_model(tmp_path, "base", vocab)
    m = ax.load_model(str(folder), device="cpu")
    ids = torch.randint(5, vocab, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    ids[1, 8:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    ours = _run_ours(m, input_ids=ids, attention_mask=mask)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[0, i], a[0], atol=TOL, rtol=0)
        torch.testing.assert_close(ours.attentions[1, i, :, :8], a[1, :, :8], atol=TOL, rtol=0)
        assert ours.attentions[1, i, :, :, 8:].abs().max() == 0  # no weight on padding
    torch.testing.assert_close(ours.hidden[0], ref.last_hidden_state[0], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[1, :8], ref.last_hidden_state[1, :8], atol=TOL, rtol=0)


def test_modernbert_runs_text_with_its_tokenizer(tmp_path):
    """`m.run(text)`: the tokenizer.json's post-processor adds [CLS] ... [SEP], and the maps are transformers'
    on the same ids."""
    tok = modernbert_tokenizer()
    hf, folder = _hf_model(tmp_path, "base", tok.get_vocab_size())
    m = ax.load_model(str(folder), device="cpu")
    text = "The capital of France is Paris."
    r = m.run(text)
    assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]" and r.special[0] and r.special[-1]
    ids = torch.tensor([tok.encode(text).ids])
    assert len(r.tokens) == ids.shape[1] > 6  # longer than a window: the local layers cut some keys
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    for i, a in enumerate(ref.attentions):
        assert abs(r.attentions[i] - a[0].numpy()).max() < TOL


def test_modernbert_old_config_fields(tmp_path):
    """A config.json from before transformers 5 (global_attn_every_n_layers, global_rope_theta /
    local_rope_theta, no layer_types or rope_parameters) reads as transformers reads it."""
    vocab = modernbert_tokenizer().get_vocab_size()
    hf, folder = _hf_model(tmp_path, "every_2", vocab)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("layer_types")
    cfg.pop("rope_parameters")
    cfg.update(global_attn_every_n_layers=2, global_rope_theta=500.0, local_rope_theta=50.0)
    (folder / "config.json").write_text(json.dumps(cfg))
    m = ax.load_model(str(folder), device="cpu")
    assert m.module.cfg.rope_theta == 500.0 and m.module.cfg.rope_local_theta == 50.0
    assert m.module.cfg.windows == [None, 3, None, 3, None]
    ids = torch.randint(5, vocab, (1, 12))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    ours = _run_ours(m, input_ids=ids)
    assert max(_max_diff(ref, ours)) < TOL


@pytest.mark.parametrize("field,value,says", [
    ("local_attention", 0, "local_attention"),
    ("layer_types", ["full_attention", "chunked_attention", "full_attention"], "chunked_attention"),
    ("hidden_activation", "swish", "swish"),
])
def test_modernbert_bad_config_is_one_line(tmp_path, field, value, says):
    vocab = modernbert_tokenizer().get_vocab_size()
    _, folder = _hf_model(tmp_path, "base", vocab)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=says):
        ax.load_model(str(folder), device="cpu")


def test_modernbert_lazy_and_hooks(tmp_path):
    """The lazy store (long inputs) recomputes the dense maps, band masks included, with padding and the d_k
    slider on one local layer; hook_pattern is the map the forward returned, and zeroing the last layer's
    hook_z moves the hidden state only."""
    from tests.api.test_lazy import _assert_same_maps, _both

    vocab = modernbert_tokenizer().get_vocab_size()
    _, folder = _hf_model(tmp_path, "every_2", vocab)
    m = ax.load_model(str(folder), device="cpu")
    torch.manual_seed(1)
    ids = torch.randint(5, vocab, (2, 29))
    mask = torch.ones_like(ids)
    mask[1, 21:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    dense, lazy, store = _both(m, inputs, dk_scale=0.7, dk_layers=[1])
    _assert_same_maps(dense, store, rows_of=[29, 21])
    torch.testing.assert_close(lazy.hidden[0], dense.hidden[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lazy.hidden[1, :21], dense.hidden[1, :21], atol=1e-5, rtol=1e-5)
    t = m.trace({"input_ids": ids[:1]}, names=lambda n: n.endswith("hook_pattern"), attentions=True)
    for i in range(m.info.num_layers):
        torch.testing.assert_close(t.cache[f"blocks.{i}.attn.hook_pattern"], t.out.attentions[:, i], atol=0, rtol=0)
    last = m.info.num_layers - 1
    off = m.trace({"input_ids": ids[:1]}, {f"blocks.{last}.attn.hook_z": lambda z, n: torch.zeros_like(z)},
                  attentions=True)
    torch.testing.assert_close(off.out.attentions, t.out.attentions, atol=0, rtol=0)
    assert (off.out.hidden - t.out.hidden).abs().max() > 1e-4
