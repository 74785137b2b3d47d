"""Batches of encoded fine-tuning features (numpy arrays held in memory) for the train loop.

Training: each epoch is a permutation of all examples drawn from (seed, epoch); global batch
i is rows [i*B, (i+1)*B) of the concatenated permutations, and each host takes its contiguous
share of those rows, so the stream is the same for any number of hosts and the state saved
with a checkpoint (the number of batches produced) resumes it exactly.
Several datasets (`blocks`: the features hold them one after the other): each global batch
comes from one of them, as sentence-transformers' multi-dataset batch samplers take theirs
(in-batch negatives stay within a dataset), each dataset its own stream of permutations drawn
from (seed, dataset, epoch). `mix` says which dataset batch i comes from: "round_robin", the
datasets in turn; "proportional", rounds of sum_d max(1, n_d // B) batches, n_d // B (at
least 1) from dataset d of n_d examples, in an order drawn from (seed, round), so the larger
datasets give more batches and each is read through at about the same pace (exactly when
every n_d is a multiple of B; a dataset smaller than a batch is read more than once a round).
Either is a function of i alone: the produced count still resumes it exactly.
Evaluation: one pass in order, the last batch padded with `example_weight` 0 rows; every host
walks the same batches (their shares), so multi-host evaluation stays in step.

Packing (data.pack, on by default for the tasks whose heads read [CLS] or every token): each
batch goes through packing.pack_batch (the layout is described in data/packing.py).
"""

from __future__ import annotations

import math

import numpy as np

from bert_jax.data import packing


def pad_batch(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """The batch's rows zero-padded to `size`, plus example_weight: 1 for real rows, 0 for padding."""
    rows = len(next(iter(batch.values())))
    pad = size - rows
    if pad:
        batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
    return {**batch, "example_weight": (np.arange(size) < rows).astype(np.float32)}


MIXES = ("proportional", "round_robin")


class _Stream:
    """Example indices of one dataset's stream: its epochs' permutations one after the other,
    drawn from (key..., epoch)."""

    def __init__(self, n: int, key: list[int]):
        self.n, self.key, self._epoch, self._perm = n, key, -1, None

    def rows(self, start: int, stop: int) -> np.ndarray:
        pos = np.arange(start, stop)
        out = []
        for e in np.unique(pos // self.n):
            if e != self._epoch:
                self._perm = np.random.default_rng([*self.key, int(e)]).permutation(self.n)
                self._epoch = int(e)
            out.append(self._perm[pos[pos // self.n == e] % self.n])
        return np.concatenate(out)


class FeaturePipeline:
    """Iterator of host-local batches (dicts of numpy arrays) with get_state()/set_state()."""

    def __init__(self, features: dict[str, np.ndarray], *, batch_size: int, train: bool, seed: int,
                 process_index: int = 0, process_count: int = 1, num_batches: int | None = None,
                 pack: dict | None = None, blocks: tuple[int, ...] = (), mix: str = "proportional"):
        """pack: None (every example padded to max_seq_length) or pack_batch's keyword
        arguments (row_multiple, microbatches, token_index). blocks: the sizes of the datasets
        the features hold one after the other (training; one dataset if fewer than two), mix
        how batches are drawn from them (MIXES)."""
        self.features = packing.rename_old(features)  # features may come under old names
        self.num_examples = len(next(iter(self.features.values())))
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
        self._stream = _Stream(self.num_examples, [seed])  # the training stream of one dataset
        self.blocks = tuple(blocks) if train and len(blocks) > 1 else ()
        if self.blocks:
            if sum(self.blocks) != self.num_examples or min(self.blocks) < 1:
                raise ValueError(f"datasets of {list(self.blocks)} examples, but the features "
                                 f"hold {self.num_examples}")
            if mix not in MIXES:
                raise ValueError(f"mix={mix!r}; choose one of {list(MIXES)}")
            if pack is not None:
                raise ValueError("several training datasets are batched unpacked (data.pack=False)")
            self.mix = mix
            self._streams = [_Stream(n, [seed, d]) for d, n in enumerate(self.blocks)]
            self._starts = np.cumsum((0, *self.blocks[:-1]))
            self._round = tuple(max(1, n // batch_size) for n in self.blocks)
            self._order: tuple = (-1, None, None)  # (round, its order, ranks): source()

    def __iter__(self):
        return self

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Example indices of global stream positions [start, stop)."""
        if not self.train:
            return np.arange(start, min(stop, self.num_examples))
        return self._stream.rows(start, stop)

    def source(self, i: int) -> tuple[int, int]:
        """(dataset, its batch count before) of global batch i, with several datasets."""
        k = len(self.blocks)
        if self.mix == "round_robin":
            return i % k, i // k
        r, pos = divmod(i, sum(self._round))
        if self._order[0] != r:  # round r's order, and each batch's count among its dataset's
            order = np.random.default_rng([self.seed, r]).permutation(
                np.repeat(np.arange(k), self._round))
            rank = np.empty_like(order)
            for d in range(k):
                rank[order == d] = np.arange(self._round[d])
            self._order = (r, order, rank)
        _, order, rank = self._order
        d = int(order[pos])
        return d, r * self._round[d] + int(rank[pos])

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_batches is not None and self.produced >= self.num_batches:
            raise StopIteration
        if self.pack is not None:
            return self._packed()
        if self.blocks:
            d, before = self.source(self.produced)
            start = before * self.batch_size + self.offset
            rows = self._starts[d] + self._streams[d].rows(start, start + self.local)
        else:
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
        packed = packing.pack_batch(batch, **self.pack)
        n_rows = len(packed["input_ids"]) // self.process_count
        rows = slice(self.process_index * n_rows, (self.process_index + 1) * n_rows)
        examples = slice(self.offset, self.offset + self.local)
        return {k: v[rows if k in packing.ROW_KEYS else examples] for k, v in packed.items()}

    def get_state(self) -> dict:
        return {"produced": self.produced}

    def set_state(self, state: dict) -> None:
        self.produced = int(state["produced"])

    @property
    def epoch(self) -> float:
        """Epochs consumed so far (training)."""
        return self.produced * self.batch_size / self.num_examples
