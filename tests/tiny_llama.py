"""A tiny random Llama saved as a Hugging Face folder, with a byte-level BPE tokenizer trained in the test
and a ChatML template: what the generation, CLI and GUI tests load instead of SmolLM2."""
from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Attention lets every token look at the tokens before it.",
    "What is the capital of Spain? Madrid is the capital of Spain.",
    "A small model with random weights still attends to something: often the first token.",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
                 "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")


def train_tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def make_llama_folder(folder: Path, seed: int = 0, **overrides) -> Path:
    """Save a random transformers LlamaForCausalLM (eager attention) and a trained tokenizer in folder."""
    import torch
    import transformers

    tok = train_tokenizer()
    cfg = dict(vocab_size=tok.get_vocab_size(), hidden_size=48, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0,
               tie_word_embeddings=True, initializer_range=0.2, attn_implementation="eager",
               bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    return folder
