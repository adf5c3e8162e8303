"""Model.generate on a tiny random Llama (and GPT-2): steps, attention rows, probabilities, sampling,
chat template, stopping, and one-line errors for bad arguments."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def model(folder):
    return ax.load_model(folder, device="cpu")


def test_greedy_steps_match_a_full_forward_and_transformers(model, folder):
    g = model.generate("The capital of France", max_new_tokens=6)
    n0 = len(g.prompt_ids)
    steps = list(g)
    assert 1 <= len(steps) <= 6 and [s.index for s in steps] == list(range(len(steps)))
    ids = torch.tensor([g.ids])
    with torch.inference_mode():
        full = model.module(input_ids=ids, output_attentions=True)
        logits = model.module.logits(full.hidden[0])
    for s in steps:
        p = n0 + s.index - 1  # the query that chose this token: the last one before it
        assert s.attention.shape == (2, 6, p + 1) and s.position == p + 1
        np.testing.assert_allclose(s.attention, full.attentions[0, :, :, p, : p + 1].numpy(), atol=1e-5)
        np.testing.assert_allclose(s.attention.sum(-1), 1.0, atol=1e-5)
        probs = torch.softmax(logits[p], -1)
        assert s.token_id == int(probs.argmax()) == s.top_ids[0]
        np.testing.assert_allclose(s.top_probs, probs.topk(len(s.top_ids)).values.numpy(), atol=1e-5)
        assert s.top_probs == sorted(s.top_probs, reverse=True)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([g.prompt_ids]), max_new_tokens=len(steps), do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert out[0, n0:].tolist()[: len(steps)] == [s.token_id for s in steps]
    assert g.text == model.tokenizer.tok.decode([s.token_id for s in steps], skip_special_tokens=False)
    assert "".join(s.text for s in steps) == g.text


def test_sampling_is_repeatable_with_a_seed_and_respects_top_k(model):
    a = [s.token_id for s in model.generate("Attention lets", 8, temperature=1.5, seed=3)]
    b = [s.token_id for s in model.generate("Attention lets", 8, temperature=1.5, seed=3)]
    assert a == b
    g = model.generate("Attention lets", 8, temperature=2.0, top_k=3, seed=4)
    n0 = len(g.prompt_ids)
    steps = list(g)
    with torch.inference_mode():  # the model's own logits at each query that chose a token
        logits = model.module.logits(model.module(input_ids=torch.tensor([g.ids])).hidden[0])
    for s in steps:
        assert len(s.top_ids) == 3 and s.token_id in s.top_ids
        assert abs(sum(s.top_probs) - 1.0) < 1e-5  # renormalised over the top 3
        want = logits[n0 + s.index - 1].topk(3)  # all three kept, none of them with probability 0
        assert s.top_ids == want.indices.tolist()
        np.testing.assert_allclose(s.top_probs, torch.softmax(want.values / 2.0, -1).numpy(), atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_top_k_keeps_exactly_k_tokens(model, k):
    """The distribution sampled from has exactly k tokens with any probability: the k largest logits,
    softmax(logits / T) over them; not k − 1, not k + 1."""
    g = model.generate("Attention lets", 1, temperature=0.5, top_k=k, seed=0)
    logits = torch.tensor([0.3, 2.0, -1.0, 1.5, 0.9, -0.2, 1.1, 0.0, 0.6, -3.0])
    p = g.distribution(logits)
    kept = torch.nonzero(p).flatten()
    assert sorted(kept.tolist()) == sorted(logits.topk(k).indices.tolist())
    torch.testing.assert_close(p[kept], torch.softmax(logits[kept] / 0.5, -1))


def test_sampling_leaves_torch_global_random_state_alone(model):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    list(model.generate("Attention lets", 3, temperature=1.0))  # no seed: drawn from the OS
    assert torch.equal(torch.rand(3), expected)


def test_temperature_flattens_the_distribution(model):
    cold = next(iter(model.generate("The capital", 1, temperature=0.5, seed=0)))
    hot = next(iter(model.generate("The capital", 1, temperature=5.0, seed=0)))
    assert hot.top_probs[0] < cold.top_probs[0]


def test_chat_template_and_stop_at_a_special_token(model, monkeypatch):
    g = model.generate("What is the capital of Spain?", 4, chat=True)
    assert g.prompt_text == "<|im_start|>user\nWhat is the capital of Spain?<|im_end|>\n<|im_start|>assistant\n"
    assert g.prompt_ids[0] == model.tokenizer.tok.token_to_id("<|im_start|>")
    # make the end-of-turn token the greedy choice at the third step: it is reported, then generation stops
    end = model.tokenizer.tok.token_to_id("<|im_end|>")
    plain, calls = model.module.logits, []

    def forced(hidden):
        logits = plain(hidden).clone()
        calls.append(1)
        if len(calls) == 3:
            logits[..., end] = logits.max() + 10
        return logits

    monkeypatch.setattr(model.module, "logits", forced)
    steps = list(model.generate("What is", 5))
    assert len(steps) == 3 and steps[-1].token_id == end and steps[-1].last and steps[-1].text.endswith("<|im_end|>")


@pytest.mark.parametrize("kw,words", [
    (dict(prompt="   "), "empty"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens="many"), "max_new_tokens"),
    (dict(temperature=-1), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(max_new_tokens=500), "positions"),
    (dict(prompt=42), "text"),
    (dict(seed=-3), "seed"),
    (dict(seed=2**64), "seed"),
])
def test_bad_arguments_are_one_line_user_errors(model, kw, words):
    args = dict(prompt="hello", max_new_tokens=3) | kw
    with pytest.raises(UserError, match=words) as e:
        model.generate(args.pop("prompt"), **args)
    assert "\n" not in str(e.value)


def test_an_encoder_cannot_generate(tmp_path):
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=20))
    bert.save_pretrained(tmp_path)
    m = ax.load_model(tmp_path, device="cpu")
    with pytest.raises(UserError, match="not a decoder"):
        m.generate("hello", 3)


def test_gpt2_generates_with_the_cache(tmp_path):
    from tests.tiny_llama import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer()
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2,
                                                              n_head=4, n_positions=64)).eval()
    hf.save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(tmp_path, device="cpu")
    g = m.generate("Attention lets every", 5)
    steps = list(g)
    with torch.no_grad():
        out = hf.generate(torch.tensor([g.prompt_ids]), max_new_tokens=5, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    assert [s.token_id for s in steps] == out[0, len(g.prompt_ids):].tolist()[: len(steps)]
    assert steps[-1].attention.shape == (2, 4, len(g.prompt_ids) + len(steps) - 1)
