"""`bert-jax features`: contextual token vectors, as the original extract_features.py."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.finetune import pad_batch
from bert_jax.data.rows import utf8_errors
from bert_jax.training import checkpoint
from bert_jax.training import state as state_lib

log = logging.getLogger(__name__)


def read_lines(path: str | os.PathLike) -> Iterator[tuple[str, str | None]]:
    """(text_a, text_b) per input line (a local or gs:// file); `A ||| B` lines are pairs, as in
    the original."""
    with utf8_errors(path), paths.path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            a, sep, b = line.partition(" ||| ")
            if " ||| " in b:  # the original splits at the last, a reader at the first: say which
                raise ValueError(f"{path}:{number}: ' ||| ' {line.count(' ||| ')} times; a line is "
                                 "one text or a pair `A ||| B` (one separator): fix that line")
            yield (a, b) if sep else (line, None)


def warn_if_cut(lengths: Sequence[int], max_seq_length: int, max_len: int, what: str) -> None:
    """Warns when inputs of these lengths (in tokens, [CLS] and [SEP] included) are cut to
    max_seq_length, as the original extract_features.py cuts them, silently."""
    cut = sum(n > max_seq_length for n in lengths)
    if not cut:
        return
    advice = (f"raise --max_seq_length (the model's position table takes up to {max_len}) to keep "
              "more" if max_seq_length < max_len else f"the model takes no more than {max_len} tokens")
    log.warning(f"warning: {what}: {cut} of {len(lengths)} inputs are longer than --max_seq_length="
                f"{max_seq_length} tokens (the longest: {max(lengths)}) and were cut to "
                f"{max_seq_length}; {advice}")


DEFAULT_LAYERS = (-1, -2, -3, -4)  # the original extract_features.py's: the last four layers


def check_layers(layers: Sequence[int] | None, num_layers: int, checkpoint_dir) -> None:
    """--layers (None: not given, DEFAULT_LAYERS) within a `num_layers`-layer model, each layer
    named once (-1 and 1 of a 2-layer model are one layer): else a ValueError naming them."""
    given = DEFAULT_LAYERS if layers is None else layers
    span = f"use -{num_layers}..{num_layers - 1}"
    for i in given:
        if not -num_layers <= i < num_layers:
            if layers is None:
                raise ValueError(
                    f"--layers is not given and its default {','.join(map(str, DEFAULT_LAYERS))} asks "
                    f"for {len(DEFAULT_LAYERS)} layers; the model in {checkpoint_dir} has "
                    f"{num_layers}: give --layers ({span}, e.g. --layers=-1)")
            raise ValueError(f"--layers: {i} is out of range for a {num_layers}-layer model ({span})")
    seen: dict[int, int] = {}
    for i in given:
        if i % num_layers in seen:
            raise ValueError(f"--layers: {seen[i % num_layers]} and {i} are the same layer of a "
                             f"{num_layers}-layer model; name each layer once")
        seen[i % num_layers] = i


def extract_features(checkpoint_dir: str | os.PathLike, input_file: str | os.PathLike,
                     output_file: str | os.PathLike, layers: Sequence[int] | None = None,
                     max_seq_length: int = 128, batch_size: int = 8) -> int:
    """Writes one JSON line per input line; returns the number of lines written. Every path may
    be local or gs://. `layers`: the encoder layers written (default DEFAULT_LAYERS)."""
    if not paths.path(input_file).is_file():
        raise FileNotFoundError(f"--input={input_file}: no such file; expected a text file with one "
                                "example per line (`A ||| B` for pairs)")
    pairs = list(read_lines(input_file))
    if not any(a or b for a, b in pairs):
        raise ValueError(f"--input={input_file}: empty (no text on any line); expected one example "
                         "per line")
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be >= 1")
    paths.check_new_file(output_file, "--output", "features")  # an earlier run's features?
    paths.make_output_folder(output_file, "--output")
    model_cfg = checkpoint.read_config(checkpoint_dir)["model"]
    name, fields = models.split_model_config(model_cfg)
    if models.CONFIGS[name] is not models.BertConfig:
        raise ValueError(f"--checkpoint={checkpoint_dir}: holds a {name!r} model ({fields.family} "
                         "family); features needs a BERT encoder checkpoint (a `bert-jax convert` "
                         "output or a BERT training workdir)")
    if max_seq_length < 3:
        raise ValueError(f"--max_seq_length={max_seq_length} leaves no room for [CLS] A [SEP] B [SEP]; "
                         "use at least 3")
    if fields.max_positions is not None and max_seq_length > fields.max_positions:
        raise ValueError(f"--max_seq_length={max_seq_length} exceeds the model's position table "
                         f"(max_len={fields.max_len} in {checkpoint_dir}); use at most {fields.max_len}")
    check_layers(layers, fields.num_layers, checkpoint_dir)
    layers = DEFAULT_LAYERS if layers is None else layers
    tokenizer = tokenizer_lib.load_tokenizer(checkpoint_dir)
    tokenizer.check_fits(fields.vocab_size, f"the model in {checkpoint_dir}")
    _, model = state_lib.load_model(checkpoint_dir, model_cfg=model_cfg)
    encoder = functools.reduce(getattr, models.encoder_path(name), model)  # a task model's encoder
    graphdef, state = nnx.split(encoder)

    @jax.jit
    def all_layers(state, input_ids, token_type_ids, attention_mask):
        out = nnx.merge(graphdef, state)(input_ids, token_type_ids, attention_mask,
                                         return_hidden=True)
        return out["hidden_states"][1:]  # the encoder layers' outputs, as all_encoder_layers

    ids_a = tokenizer.encode_batch([a for a, _ in pairs])
    encoded_b = iter(tokenizer.encode_batch([b for _, b in pairs if b is not None]))
    ids_b = [None if b is None else next(encoded_b) for _, b in pairs]
    warn_if_cut([len(a) + (2 if b is None else 3 + len(b)) for a, b in zip(ids_a, ids_b)],
                max_seq_length, fields.max_len, f"--input={input_file}")
    inputs = tokenizer.pair_rows(ids_a, ids_b, max_seq_length)
    lengths = inputs["attention_mask"].sum(1)
    with paths.path(output_file).open("w", encoding="utf-8") as f:
        for start in range(0, len(pairs), batch_size):
            # Always batch_size rows (padding rows at the end): one shape, one compile.
            batch = pad_batch({k: v[start:start + batch_size] for k, v in inputs.items()}, batch_size)
            hidden_LBTD = np.asarray(all_layers(state, *(jnp.asarray(batch[k]) for k in
                                                        ("input_ids", "token_type_ids", "attention_mask"))))
            for row in range(min(batch_size, len(pairs) - start)):
                tokens = tokenizer.tokens(batch["input_ids"][row, :lengths[start + row]])
                feats = [{"token": token,
                          "layers": [{"index": i, "values": [round(float(x), 6)
                                                             for x in hidden_LBTD[i, row, t]]}
                                     for i in layers]}
                         for t, token in enumerate(tokens)]
                f.write(json.dumps({"linex_index": start + row, "features": feats}) + "\n")
    return len(pairs)
