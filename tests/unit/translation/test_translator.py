"""Translator's batching: sentences sorted by length into batches of one row count, an input
smaller than a batch decoded as a smaller batch, translations returned in input order."""

import numpy as np

from bert_jax import config as config_lib
from bert_jax.training import sharding
from bert_jax.translation import translate

SEP, CLS, MASK = 2, 1, 3


class WordIds:
    """A tokenizer of integer words: "7 8" <-> [7, 8]."""

    sep_id, cls_id, mask_id = SEP, CLS, MASK

    def encode_batch(self, sentences):
        return [np.array([int(w) for w in s.split()], np.int32) for s in sentences]

    def decode(self, ids):
        return " ".join(str(int(i)) for i in ids if i)


def echo_translator(batch_size: int) -> tuple[translate.Translator, list]:
    """A Translator on the 8-device mesh whose decoding echoes each source, recording the
    [rows, length] of each batch it is given."""
    config = config_lib.training_defaults()
    mesh = sharding.make_mesh(config.mesh)
    t = translate.Translator(config, None, mesh, WordIds(), beam_size=1, alpha=0.0, max_extra=0,
                             batch_size=batch_size)
    shapes = []

    def echo(params, src):
        shapes.append(src.shape)
        return src

    t._decode = echo
    return t, shapes


def sentences(n: int) -> list[str]:
    return [" ".join(str(10 + i) for _ in range(1 + i % 5)) for i in range(n)]


def test_an_input_smaller_than_a_batch_decodes_as_a_smaller_batch():
    t, shapes = echo_translator(batch_size=64)
    assert t(None, sentences(3)) == sentences(3)
    assert shapes == [(8, 8)]  # 3 sentences in 8 rows (the mesh's 8 batch shards), not 64


def test_a_longer_input_keeps_one_row_count_and_input_order():
    t, shapes = echo_translator(batch_size=16)
    assert t(None, sentences(20)) == sentences(20)
    assert [rows for rows, _ in shapes] == [16, 16]  # the last, partial batch as the first
