"""Batches of encoded fine-tuning features (numpy arrays held in memory) for the train loop.

Training: each epoch is a permutation of all examples drawn from (seed, epoch); global batch
i is rows [i*B, (i+1)*B) of the concatenated permutations, and each host takes its contiguous
share of those rows, so the stream is the same for any number of hosts and the state saved
with a checkpoint (the number of batches produced) resumes it exactly.
Evaluation: one pass in order, the last batch padded with `example_weight` 0 rows; every host
walks the same batches (their shares), so multi-host evaluation stays in step.

Packing (`pack_batch`, on by default for the tasks whose heads read [CLS] or every token): the
B examples of a batch keep their per-example arrays (labels, weights) in the same order, but
their token sequences are packed first-fit into rows of max_seq_length, each with its own
positions (from 0) and packed-sequence id (`input_mask` 1, 2, ... in the row; 0 = padding), so
attention never crosses examples and every example computes exactly what it computes alone.
`cls_index` ([B] or [B, C]) and `token_index` ([B, T]) point each example back into the
flattened rows. The row count is the smallest of a few sizes (`row_buckets`) that holds the
batch, so a batch of short sentences costs a fraction of B padded rows with few compiles.
"""

from __future__ import annotations

import math

import numpy as np

PACKED = ("input_ids", "input_mask", "segment_ids")  # the per-token arrays that get packed
ROW_KEYS = (*PACKED, "positions")  # a packed batch's [R, T] arrays; the others are per example


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
    """A batch of B examples ([B, T] or [B, C, T] token arrays) with its token arrays packed
    into [R, T] rows (see the module docstring). Example i belongs to microbatch i % k and its
    sequences go into rows r with r % k == that microbatch (the train step's split), and its
    indices count within its microbatch's rows. R is a bucket size that is a multiple of
    `row_multiple` * k (the batch shards of the mesh)."""
    ids = batch["input_ids"]
    B, T, k = ids.shape[0], ids.shape[-1], microbatches
    choices = ids.shape[1] if ids.ndim == 3 else 0
    flat = {key: batch[key].reshape(-1, T) for key in PACKED}  # sequence s = example s // C
    per_example = max(choices, 1)
    lengths = (flat["input_mask"] > 0).sum(-1)
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
    out = {key: np.zeros((rows, T), np.int32) for key in PACKED}
    out["positions"] = np.zeros((rows, T), np.int32)
    count = np.zeros(rows, np.int32)  # sequences placed in each row so far
    seq_order = np.lexsort((place[:, 1], place[:, 0]))  # ids increase along each row
    for s in seq_order:
        m = (s // per_example) % k
        row, start, n = place[s][0] * k + m, place[s][1], int(lengths[s])
        if n == 0:
            continue
        count[row] += 1
        for key in ("input_ids", "segment_ids"):
            out[key][row, start:start + n] = flat[key][s, :n]
        out["input_mask"][row, start:start + n] = count[row]
        out["positions"][row, start:start + n] = np.arange(n)
    start_in_micro = place[:, 0] * T + place[:, 1]  # flat index within the microbatch's rows
    cls = start_in_micro.astype(np.int32)
    packed = {**{key: v for key, v in batch.items() if key not in PACKED}, **out,
              "cls_index": cls.reshape(B, choices) if choices else cls}
    if token_index:
        if choices:
            raise ValueError("token_index: tagging batches have one sequence per example")
        within = np.minimum(np.arange(T)[None, :], np.maximum(lengths[:, None] - 1, 0))
        packed["token_index"] = (cls[:, None] + within).astype(np.int32)
    return packed


def pad_batch(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """The batch's rows zero-padded to `size`, plus example_weight: 1 for real rows, 0 for padding."""
    rows = len(next(iter(batch.values())))
    pad = size - rows
    if pad:
        batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
    return {**batch, "example_weight": (np.arange(size) < rows).astype(np.float32)}


class FeaturePipeline:
    """Iterator of host-local batches (dicts of numpy arrays) with get_state()/set_state()."""

    def __init__(self, features: dict[str, np.ndarray], *, batch_size: int, train: bool, seed: int,
                 process_index: int = 0, process_count: int = 1, num_batches: int | None = None,
                 pack: dict | None = None):
        """pack: None (every example padded to max_seq_length) or pack_batch's keyword
        arguments (row_multiple, microbatches, token_index)."""
        self.features = features
        self.num_examples = len(next(iter(features.values())))
        if self.num_examples == 0:
            raise ValueError("no examples to batch")
        if batch_size % process_count:
            raise ValueError(f"batch size {batch_size} is not divisible by {process_count} processes")
        self.batch_size, self.train, self.seed = batch_size, train, seed
        self.local = batch_size // process_count
        self.offset = process_index * self.local
        self.pack, self.process_index, self.process_count = pack, process_index, process_count
        self.num_batches = num_batches if num_batches is not None else (
            None if train else math.ceil(self.num_examples / batch_size))
        self.produced = 0
        self._perm_epoch, self._perm = -1, None

    def __iter__(self):
        return self

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.num_examples), epoch
        return self._perm

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Example indices of global stream positions [start, stop)."""
        n = self.num_examples
        if not self.train:
            return np.arange(start, min(stop, n))
        pos = np.arange(start, stop)
        return np.concatenate([self._epoch_order(int(e))[pos[pos // n == e] % n]
                               for e in np.unique(pos // n)])

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_batches is not None and self.produced >= self.num_batches:
            raise StopIteration
        if self.pack is not None:
            return self._packed()
        start = self.produced * self.batch_size + self.offset
        rows = self._rows(start, start + self.local)
        self.produced += 1
        batch = {k: v[rows] for k, v in self.features.items()}
        return batch if self.train else pad_batch(batch, self.local)

    def _packed(self) -> dict[str, np.ndarray]:
        """This host's share of the packed global batch: every host packs the whole batch
        (the same way), then keeps its examples and its rows."""
        start = self.produced * self.batch_size
        rows = self._rows(start, start + self.batch_size)
        self.produced += 1
        batch = {k: v[rows] for k, v in self.features.items()}
        if not self.train:
            batch = pad_batch(batch, self.batch_size)
        packed = pack_batch(batch, **self.pack)
        n_rows = len(packed["input_ids"]) // self.process_count
        rows = slice(self.process_index * n_rows, (self.process_index + 1) * n_rows)
        examples = slice(self.offset, self.offset + self.local)
        return {k: v[rows if k in ROW_KEYS else examples] for k, v in packed.items()}

    def get_state(self) -> dict:
        return {"produced": self.produced}

    def set_state(self, state: dict) -> None:
        self.produced = int(state["produced"])

    @property
    def epoch(self) -> float:
        """Epochs consumed so far (training)."""
        return self.produced * self.batch_size / self.num_examples
