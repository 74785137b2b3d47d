"""The attention seam (bert_jax/models/attention.py): what a Masking allows, checked against
a plain loop; the registry and its error; the models hand kernels segment ids and positions,
never a dense mask."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import models
from bert_jax.models import attention
from bert_jax.models.attention import Masking

PACKAGE = Path(__file__).resolve().parents[1] / "bert_jax"


def _loop_mask(q_seg, kv_seg, *, causal=False, window=None, q_offset=0):
    """Who sees whom, one (query, key) pair at a time."""
    B, T = q_seg.shape
    S = kv_seg.shape[1]
    out = np.zeros((B, 1, T, S), bool)
    for b in range(B):
        for t in range(T):
            for s in range(S):
                ok = kv_seg[b, s] != 0 and (q_seg[b, t] == kv_seg[b, s] or q_seg[b, t] == 0)
                if causal:
                    ok = ok and s <= q_offset + t
                if window is not None:
                    ok = ok and abs(q_offset + t - s) <= window
                out[b, 0, t, s] = ok
    return out


@pytest.mark.parametrize("causal,window,q_offset", [(False, None, 0), (True, None, 0),
                                                     (False, 2, 0), (True, 1, 0), (True, None, 3)])
def test_dense_mask_is_what_the_masking_says(causal, window, q_offset):
    rng = np.random.RandomState(0)
    q_seg = rng.randint(0, 3, (3, 6))  # packed ids 1, 2 and padding 0, mixed
    kv_seg = q_seg if q_offset == 0 else rng.randint(0, 3, (3, 9))
    pos_q, pos_k = np.zeros_like(q_seg), np.zeros_like(kv_seg)  # positions do not decide
    m = Masking(jnp.asarray(q_seg), jnp.asarray(kv_seg), jnp.asarray(pos_q), jnp.asarray(pos_k),
                q_offset=q_offset, causal=causal, window=window)
    np.testing.assert_array_equal(np.asarray(attention.dense_mask(m)),
                                  _loop_mask(q_seg, kv_seg, causal=causal, window=window,
                                             q_offset=q_offset))


def test_explicit_softmax_path_equals_the_fused_one():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 3, 4)) for i in range(3))
    seg = jnp.asarray([[1, 1, 2, 2, 0], [1, 1, 1, 1, 1]])
    pos = jnp.asarray([[0, 1, 0, 1, 0], [0, 1, 2, 3, 4]])
    m = Masking(seg, seg, pos, pos, causal=True)
    fast, none = attention.xla_attention(q, k, v, m)
    assert none is None
    # Probabilities asked for force the explicit path; so does any dropout rate.
    explicit, probs = attention.xla_attention(q, k, v, m, return_probs=True)
    np.testing.assert_allclose(explicit, fast, atol=1e-5)
    tiny_drop, _ = attention.xla_attention(q, k, v, m, dropout_rate=1e-12, rng=jax.random.key(0))
    np.testing.assert_allclose(tiny_drop, fast, atol=1e-5)
    assert probs.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    # Packed segments never see each other; causal rows see no later key.
    p = np.asarray(probs)
    assert (p[0, :, :2, 2:] == 0).all() and (p[0, :, 2:4, :2] == 0).all()
    assert (np.triu(p[1], k=1) == 0).all()


def test_unknown_kernel_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"model.attention_kernel='flash'.*\['splash', 'xla'\]"):
        models.create_model(models.model_section("bert", models.bert_model_fields("tiny"),
                                                 attention_kernel="flash"))


def test_every_kernel_has_the_reference_signature():
    q = k = v = jnp.ones((1, 128, 2, 8))  # splash tiles in multiples of 128
    seg, pos = jnp.ones((1, 128), jnp.int32), jnp.arange(128)[None]
    for name, fn in attention.KERNELS.items():
        out, probs = fn(q, k, v, Masking(seg, seg, pos, pos), dropout_rate=0.0, rng=None,
                        return_probs=False)
        assert out.shape == (1, 128, 2, 8) and probs is None, name


def test_dense_masks_live_only_in_the_attention_module():
    """The models pass segment ids and positions; only kernels build a [B, 1, T, S] mask."""
    for path in (PACKAGE / "models").glob("*.py"):
        if path.name != "attention.py":
            assert "dense_mask" not in path.read_text(), path.name
            assert "attention_mask(" not in path.read_text().replace("attention_mask: ", ""), path.name


def test_a_local_window_keeps_each_token_to_its_neighbours():
    """model.attention_window=2 in a one-layer BERT: changing the last token changes only the
    outputs within 2 positions of it; without a window it changes every output."""
    ids = jnp.asarray(np.random.RandomState(0).randint(5, 100, (1, 16)))
    changed = ids.at[0, 15].set(4)
    moved = {}
    for window in (0, 2):
        model = models.create_model(models.model_section(
            "bert", models.bert_model_fields("tiny"), num_layers=1, attention_window=window))
        a, b = (model(x)["sequence_output"][0] for x in (ids, changed))
        moved[window] = np.flatnonzero(np.abs(np.asarray(a - b)).max(-1) > 1e-6).tolist()
    assert moved == {0: list(range(16)), 2: [13, 14, 15]}
