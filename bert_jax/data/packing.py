"""Batch fields and packed rows: what each field of a batch holds, the packed layout of each
kind of data, the packers that build it, and the fields' old names (still read, `rename_old`).

BERT rows (pretraining and fine-tuning), under the names the model takes (Hugging Face's):
  input_ids       token ids, 0 = padding
  token_type_ids  segment A (0) or B (1) of [CLS] A [SEP] B [SEP]
  attention_mask  unpacked rows only: 1 on real tokens, 0 on padding
  segment_ids     packed rows only: which packed sequence each token belongs to, 1, 2, ...
                  along the row, 0 = padding (the name of splash attention, MaxText and t5x)
  positions       packed rows only: each token's position within its sequence, from 0
Unpacked arrays are [B, T] (multiple choice [B, C, T]); packed ones [R, T] rows. A batch is
packed exactly when it has segment_ids. How a packed batch finds its examples is the
objective's `packing` (training/objectives.py):
  "cls"     cls_index [B] or [B, C]: each example's [CLS] as an index into the R*T tokens
  "tokens"  cls_index and token_index [B, T]: each example token's index into the R*T tokens
  "rows"    read in place: pretraining's masked_lm_positions and next_sentence_positions
            [B, S] point into the row (next_sentence_weights 0 = empty slot); sequence
            targets are per token

Sequence pairs (translation; the decoder LM has targets only), always in this layout:
  inputs, targets                          token ids, 0 = padding
  inputs_segment_ids, targets_segment_ids  packed-sequence id of each token, 1, 2, ...; 0 = padding
  inputs_positions, targets_positions      position within its sequence, from 0
An unpacked row is one sequence (segment id 1 on every token).

Packers, all first fit, all writing segment ids and positions as above:
  pack_batch  a fine-tuning batch's examples into the fewest of a few row counts (first fit
              decreasing), the examples' own arrays (labels, weights) kept in order
  first_fit   a grain stream of examples into rows, a batch of rows at a time: pretraining
              instances (then pretraining.pack_row) and translation pairs

Old names (Google BERT's TFRecord features and earlier versions of this package), read by
`rename_old` wherever batches enter the trainer (training/input.py):
  input_mask   -> attention_mask, or segment_ids in packed rows (it held the sequence ids)
  segment_ids  -> token_type_ids, in a batch that has input_mask (it held A/B)
  <x>_segmentation, <x>_position -> <x>_segment_ids, <x>_positions
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from grain.experimental import FirstFitPackIterDataset

TOKENS = ("input_ids", "token_type_ids", "attention_mask")  # an unpacked example's token arrays
ROW_KEYS = ("input_ids", "token_type_ids", "segment_ids", "positions")  # a packed batch's [R, T] arrays
SEQUENCE_KEYS = ("inputs", "targets")


def rename_old(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The batch under the current field names, whichever names it came with (see above)."""
    out = dict(batch)
    if "input_mask" in out:
        if "token_type_ids" in out or "attention_mask" in out:
            raise ValueError(f"a batch with both old and new field names: {sorted(out)}; "
                             "input_mask belongs with segment_ids as the A/B token type")
        mask = out.pop("input_mask")
        if "segment_ids" in out:
            out["token_type_ids"] = out.pop("segment_ids")
        out["segment_ids" if "positions" in out else "attention_mask"] = mask
    for key in SEQUENCE_KEYS:
        for old, new in (("_segmentation", "_segment_ids"), ("_position", "_positions")):
            if key + old in out:
                out[key + new] = out.pop(key + old)
    return out


def real_tokens(batch: Mapping) -> object:
    """Where a BERT batch has real (not padding) tokens: a bool array shaped as its input_ids
    (numpy or jax, as the batch)."""
    return batch["segment_ids" if "segment_ids" in batch else "attention_mask"] > 0


def first_fit(ds, lengths: Mapping[str, int], *, rows: int, seed: int, train: bool):
    """grain IterDataset of packed rows: the examples of `ds` (dicts of 1-D arrays) placed
    first fit into `rows` rows at a time, key k padded to lengths[k], with grain's
    `<k>_segment_ids` and `<k>_positions` added for every key; rows shuffled when training."""
    return FirstFitPackIterDataset(ds, length_struct=dict(lengths), num_packing_bins=rows, seed=seed,
                                   shuffle_bins=train)


def row_buckets(max_rows: int, multiple: int) -> list[int]:
    """Row counts a packed batch may have: multiple * 2^k, then max_rows (a multiple of
    `multiple`), increasing."""
    sizes, r = [], multiple
    while r < max_rows:
        sizes.append(r)
        r *= 2
    return sizes + [max_rows]


def pack_batch(batch: dict[str, np.ndarray], *, row_multiple: int, microbatches: int = 1,
               token_index: bool = False) -> dict[str, np.ndarray]:
    """A fine-tuning batch of B examples ([B, T] or [B, C, T] token arrays) with its token
    arrays packed into [R, T] rows: each sequence keeps its tokens and token types and gets
    its segment id and positions, so attention never crosses examples and every example
    computes exactly what it computes alone. The per-example arrays (labels, weights) stay
    in order; cls_index ([B] or [B, C]) and with `token_index` token_index ([B, T]) point
    each example into the flattened rows. Example i belongs to microbatch i % k and its
    sequences go into rows r with r % k == that microbatch (the train step's split), and its
    indices count within its microbatch's rows. R is the smallest row_buckets size, a
    multiple of `row_multiple` * k (the batch shards of the mesh), that holds the batch, so a
    batch of short sentences costs a fraction of B padded rows with few compiles."""
    batch = rename_old(batch)
    ids = batch["input_ids"]
    B, T, k = ids.shape[0], ids.shape[-1], microbatches
    choices = ids.shape[1] if ids.ndim == 3 else 0
    flat = {key: batch[key].reshape(-1, T) for key in TOKENS}  # sequence s = example s // C
    per_example = max(choices, 1)
    lengths = (flat["attention_mask"] > 0).sum(-1)
    # First-fit decreasing into each microbatch's rows, longest sequences first.
    place = np.zeros((len(lengths), 2), np.int64)  # (row within microbatch, start)
    used = []
    for m in range(k):
        seqs = [s for s in range(len(lengths)) if (s // per_example) % k == m]
        fill: list[int] = []
        for s in sorted(seqs, key=lambda s: -lengths[s]):
            n = int(lengths[s])
            if n == 0:  # an eval batch's padding example: points at row 0, weight 0
                continue
            row = next((r for r, f in enumerate(fill) if f + n <= T), None)
            if row is None:
                row = len(fill)
                fill.append(0)
            place[s] = row, fill[row]
            fill[row] += n
        used.append(len(fill))
    # B is a multiple of k * row_multiple (config.validate), so B * C / k rows (one sequence
    # each) is the largest bucket.
    per_micro = next(r for r in row_buckets(B * per_example // k, row_multiple) if r >= max(used))
    rows = per_micro * k
    out = {key: np.zeros((rows, T), np.int32) for key in ROW_KEYS}
    count = np.zeros(rows, np.int32)  # sequences placed in each row so far
    seq_order = np.lexsort((place[:, 1], place[:, 0]))  # ids increase along each row
    for s in seq_order:
        m = (s // per_example) % k
        row, start, n = place[s][0] * k + m, place[s][1], int(lengths[s])
        if n == 0:
            continue
        count[row] += 1
        for key in ("input_ids", "token_type_ids"):
            out[key][row, start:start + n] = flat[key][s, :n]
        out["segment_ids"][row, start:start + n] = count[row]
        out["positions"][row, start:start + n] = np.arange(n)
    start_in_micro = place[:, 0] * T + place[:, 1]  # flat index within the microbatch's rows
    cls = start_in_micro.astype(np.int32)
    packed = {**{key: v for key, v in batch.items() if key not in TOKENS}, **out,
              "cls_index": cls.reshape(B, choices) if choices else cls}
    if token_index:
        if choices:
            raise ValueError("token_index: tagging batches have one sequence per example")
        within = np.minimum(np.arange(T)[None, :], np.maximum(lengths[:, None] - 1, 0))
        packed["token_index"] = (cls[:, None] + within).astype(np.int32)
    return packed
