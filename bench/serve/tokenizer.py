"""A word-level tokenizer whose vocabulary is the model's (bench.engine.model's
vocab_size): written as tokenizer.json (the `tokenizers` library's format, by hand, so
building it needs no library) and tokenizer_config.json, for transformers'
PreTrainedTokenizerFast, which vLLM's server and `vllm bench serve` load.

Token i is the word "t<i>" (ids 0-3 the special tokens the model config names:
pad 0, bos 1, eos 2, unk 3); text is split on whitespace and decoded joined by
spaces, so decoding then encoding ids gives them back (the random dataset of
`vllm bench serve` relies on that to hit its prompt lengths).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def word(token_id: int) -> str:
    return SPECIALS[token_id] if token_id < len(SPECIALS) else f"t{token_id}"


def tokenizer_json(vocab_size: int) -> dict:
    """tokenizer.json of a WordLevel model over vocab_size words."""
    if vocab_size <= len(SPECIALS):
        raise ValueError(f"the vocabulary must hold more than the {len(SPECIALS)} special tokens")
    added = [
        {
            "id": i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(SPECIALS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {word(i): i for i in range(vocab_size)},
            "unk_token": "<unk>",
        },
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
    }


def write(folder: Path, vocab_size: int) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json in folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab_size)))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    special = {k: v for k, v in tokenizer_config().items() if k.endswith("_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
