"""The served model's directory: the bench's one-rank Nemotron-H with its MTP drafter
(bench.engine.model.mtp_model_config, 40 Mamba-2 layers), long enough for the seed
document's ~10k-token prompts, and the word-level tokenizer (tokenizer.py) beside it.
vLLM loads it with load_format dummy: config.json is all the weights it needs."""

from __future__ import annotations

import json
from pathlib import Path

from bench.engine import model

from . import tokenizer

MAX_MODEL_LEN = 12288
"""The servers' --max-model-len: a 10000-token prompt, its output, and room."""


def serve_config(spec_tokens: int) -> dict:
    """config.json: the MTP variant where there is a drafter, else the plain one.
    Nemotron-H's attention has no positional embedding, so raising
    max_position_embeddings to MAX_MODEL_LEN changes no layer."""
    config = model.mtp_model_config(1) if spec_tokens else model.model_config(1)
    return {**config, "max_position_embeddings": MAX_MODEL_LEN}


def write(folder: Path, spec_tokens: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = serve_config(spec_tokens)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.write(folder, config["vocab_size"])
    return folder


class TokenizerUnusable(RuntimeError):
    """transformers cannot load the tokenizer, or its vocabulary is not the model's."""


def check_tokenizer(folder: Path) -> str:
    """Loads the tokenizer as vLLM does (transformers' AutoTokenizer); one line about it."""
    from transformers import AutoTokenizer

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    try:
        loaded = AutoTokenizer.from_pretrained(str(folder))
    except Exception as error:
        raise TokenizerUnusable(f"transformers could not load {folder}: {error}") from error
    if len(loaded) != vocab:
        raise TokenizerUnusable(f"the tokenizer has {len(loaded)} tokens, the model {vocab}")
    import transformers

    return (
        f"{type(loaded).__name__}, {len(loaded)} tokens (transformers {transformers.__version__})"
    )
