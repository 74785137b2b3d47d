"""Synthetic batches, each example a pure function of (seed, split, example index).

For engine tests, benchmarks and dry runs without a corpus.
SyntheticPretraining (BERT): each sequence is an arithmetic progression over the vocabulary
with 10% noise, so masked tokens are predictable from their neighbours and segment B
continues A's progression exactly when it is the true next sentence: both MLM and NSP
accuracy rise when training works.
SyntheticTranslation (encoder-decoder): the target is the source reversed, which needs
both the encoder-decoder attention and the positions to learn.
"""

from __future__ import annotations

import numpy as np

PAD, CLS, SEP, MASK, FIRST_WORD = 0, 1, 2, 3, 4
SPLITS = {"train": 0, "validation": 1}


def _example(rng: np.random.Generator, vocab: int, length: int, max_pred: int
             ) -> dict[str, np.ndarray]:
    # Progressions run over the first <= 64 words (noise uses the whole vocabulary), so even
    # the first steps have something to learn: which tokens occur at all.
    words = min(vocab - FIRST_WORD, 64)
    used = int(rng.integers(length // 2, length + 1))  # real tokens incl. [CLS] and 2x [SEP]
    len_a = int(rng.integers(1, used - 3 + 1 - 1)) if used > 4 else 1
    len_b = used - 3 - len_a
    start, stride = rng.integers(0, words, size=2)
    is_random_next = bool(rng.random() < 0.5)
    seq_a = (start + stride * np.arange(len_a)) % words
    if is_random_next:
        start_b, stride_b = rng.integers(0, words, size=2)
        seq_b = (start_b + stride_b * np.arange(len_b)) % words
    else:
        seq_b = (start + stride * np.arange(len_a, len_a + len_b)) % words
    seq = np.concatenate([seq_a, seq_b]) + FIRST_WORD
    noise = rng.random(seq.shape) < 0.1
    seq = np.where(noise, rng.integers(FIRST_WORD, vocab, size=seq.shape), seq)

    ids = np.full(length, PAD, np.int32)
    ids[:used] = np.concatenate([[CLS], seq[:len_a], [SEP], seq[len_a:], [SEP]])
    token_type = np.zeros(length, np.int32)
    token_type[len_a + 2:used] = 1
    mask = (np.arange(length) < used).astype(np.int32)

    candidates = np.flatnonzero(ids >= FIRST_WORD)
    n_pred = min(max_pred, max(1, round(0.15 * len(candidates))))
    chosen = np.sort(rng.choice(candidates, size=n_pred, replace=False))
    labels = ids[chosen].copy()
    action = rng.random(n_pred)  # 80% [MASK], 10% random word, 10% unchanged
    ids[chosen] = np.where(action < 0.8, MASK,
                           np.where(action < 0.9, rng.integers(FIRST_WORD, vocab, n_pred), labels))
    pad = max_pred - n_pred
    return {
        "input_ids": ids, "attention_mask": mask, "token_type_ids": token_type,
        "masked_lm_positions": np.pad(chosen, (0, pad)).astype(np.int32),
        "masked_lm_ids": np.pad(labels, (0, pad)).astype(np.int32),
        "masked_lm_weights": np.pad(np.ones(n_pred, np.float32), (0, pad)),
        "next_sentence_labels": np.int32(is_random_next),
    }


class SyntheticPretraining:
    """Iterator over this host's rows of each global batch; `get_state`/`set_state` give the
    position (batches consumed), which the checkpoint stores for exact resume."""

    def __init__(self, *, vocab_size: int, seq_len: int, batch_size: int, seed: int,
                 max_predictions: int = 0, split: str = "train", process_index: int = 0,
                 process_count: int = 1, num_batches: int | None = None, nsp: bool = True):
        if split not in SPLITS:
            raise ValueError(f"synthetic data split {split!r}; choose one of {sorted(SPLITS)}")
        if vocab_size <= FIRST_WORD + 1 or seq_len < 8:
            raise ValueError(f"synthetic data needs vocab_size > {FIRST_WORD + 1} and seq_len >= 8")
        self.vocab, self.seq_len, self.max_pred = vocab_size, seq_len, max_predictions
        self.seed, self.split_id = seed, SPLITS[split]
        self.local = batch_size // process_count
        self.first_row = process_index * self.local
        self.global_size, self.num_batches = batch_size, num_batches
        self.nsp = nsp  # False: no next_sentence_labels (an MLM-only model, model.nsp=False)
        self.position = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_batches is not None and self.position >= self.num_batches:
            raise StopIteration
        rows = []
        for r in range(self.first_row, self.first_row + self.local):
            index = self.position * self.global_size + r
            rng = np.random.default_rng((self.seed, self.split_id, index))
            rows.append(self.example(rng))
        self.position += 1
        return {k: np.stack([row[k] for row in rows]) for k in rows[0]}

    def example(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        example = _example(rng, self.vocab, self.seq_len, self.max_pred)
        if not self.nsp:
            del example["next_sentence_labels"]
        return example

    def get_state(self) -> dict:
        return {"position": self.position}

    def set_state(self, state: dict) -> None:
        self.position = int(state["position"])


class SyntheticTranslation(SyntheticPretraining):
    """(inputs, targets) pairs, targets = inputs reversed, one pair per row (no packing):
    lengths uniform in [1, seq_len], padded with 0, with the packing keys of a real
    translation batch (`<x>_segment_ids`: 1 on tokens; `<x>_positions`; data/packing.py)."""

    def example(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        n = int(rng.integers(1, self.seq_len + 1))
        source = rng.integers(FIRST_WORD, min(self.vocab, FIRST_WORD + 64), n).astype(np.int32)
        out = {}
        for key, ids in (("inputs", source), ("targets", source[::-1])):
            pad = self.seq_len - n
            out[key] = np.pad(ids, (0, pad))
            out[f"{key}_segment_ids"] = np.pad(np.ones(n, np.int32), (0, pad))
            out[f"{key}_positions"] = np.pad(np.arange(n, dtype=np.int32), (0, pad))
        return out
