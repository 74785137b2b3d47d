"""`bert-jax features`: contextual token vectors, as the original extract_features.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import checkpoint
from bert_jax.data.tokenizers import WordPieceTokenizer


def read_lines(path: str | os.PathLike) -> Iterator[tuple[str, str | None]]:
    """(text_a, text_b) per input line; `A ||| B` lines are pairs, as in the original."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            a, sep, b = line.partition(" ||| ")
            yield (a, b) if sep else (line, None)


def _encoder(model: nnx.Module) -> nnx.Module:
    """The BertModel inside any task model (or the model itself)."""
    return getattr(model, "bert", model)


def extract_features(checkpoint_dir: str | os.PathLike, input_file: str | os.PathLike,
                     output_file: str | os.PathLike, layers: Sequence[int] = (-1, -2, -3, -4),
                     max_seq_length: int = 128, batch_size: int = 8) -> int:
    """Writes one JSON line per input line; returns the number of lines written."""
    model_cfg, model = checkpoint.load_model(checkpoint_dir)
    encoder = _encoder(model)
    num_layers = model_cfg["num_layers"]
    for i in layers:
        if not -num_layers <= i < num_layers:
            raise ValueError(f"--layers: {i} is out of range for a {num_layers}-layer model "
                             f"(use -{num_layers}..{num_layers - 1})")
    tokenizer = WordPieceTokenizer.from_pretrained_dir(checkpoint_dir)
    graphdef, state = nnx.split(encoder)

    @jax.jit
    def all_layers(state, input_ids, token_type_ids, attention_mask):
        out = nnx.merge(graphdef, state)(input_ids, token_type_ids, attention_mask,
                                         return_hidden=True)
        return out["hidden_states"][1:]  # the encoder layers' outputs, as all_encoder_layers

    examples = [tokenizer.encode(a, b, max_length=max_seq_length) for a, b in read_lines(input_file)]
    Path(output_file).parent.mkdir(parents=True, exist_ok=True)
    with open(output_file, "w", encoding="utf-8") as f:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start:start + batch_size]
            arrays = np.zeros((3, batch_size, max_seq_length), np.int32)  # fixed shape: 1 compile
            for row, ex in enumerate(chunk):
                n = len(ex.input_ids)
                arrays[:, row, :n] = [ex.input_ids, ex.token_type_ids, [1] * n]
            hidden_LBTD = np.asarray(all_layers(state, *map(jnp.asarray, arrays)))
            for row, ex in enumerate(chunk):
                feats = [{"token": token,
                          "layers": [{"index": i, "values": [round(float(x), 6)
                                                             for x in hidden_LBTD[i, row, t]]}
                                     for i in layers]}
                         for t, token in enumerate(ex.tokens)]
                f.write(json.dumps({"linex_index": start + row, "features": feats}) + "\n")
    return len(examples)
