"""The memory guard counts the KV cache a decoder's run keeps for the next one (reuse_prefix), beside the maps:
a run whose maps fit but whose maps and cache do not is refused in one line that names the cache."""
from __future__ import annotations

import pytest

import attn_explorer as ax
from attn_explorer.api import model as model_mod
from attn_explorer.api import prefix
from attn_explorer.errors import UserError
from tests.tiny_llama import make_llama_folder

TEXT = "The capital of France is Paris and the capital of Italy is Rome"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return ax.load_model(str(make_llama_folder(tmp_path_factory.mktemp("llama"), num_hidden_layers=3)), device="cpu")


def test_the_kept_cache_is_counted(llama, monkeypatch):
    n = len(llama.prepare(TEXT).tokens)
    attn = llama.module.blocks.layers[0].attn
    L, H, H_kv, d = 3, attn.num_heads, attn.num_kv_heads, attn.head_dim
    assert H_kv < H  # grouped-query: the cache is H_kv heads wide
    maps = L * H * n * n * 4  # float32 maps, 4 bytes an element
    cache = 2 * L * H_kv * n * d * 4  # keys and values of every layer, float32
    monkeypatch.setattr(model_mod, "default_budget", lambda device: maps + cache - 1)
    prefix.forget()
    assert llama.run(TEXT, lazy=False).attentions.shape[-1] == n  # no cache kept: the maps fit
    with pytest.raises(UserError) as e:
        llama.run(TEXT, lazy=False, reuse_prefix=True)
    assert "KV cache" in str(e.value) and "\n" not in str(e.value)
    assert prefix.kept_tokens() == 0  # refused before it ran: nothing half-kept
    monkeypatch.setattr(model_mod, "default_budget", lambda device: maps + cache)
    assert llama.run(TEXT, lazy=False, reuse_prefix=True).reuse.startswith("reused 0 of")
    prefix.forget()
