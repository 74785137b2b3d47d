"""The cudnn kernel (models/kernels/cudnn.py) on a machine without a GPU: the mapping of a Masking
onto jax.nn.dot_product_attention's masks (key counts, is_causal, a causal window, global
layers) run with implementation="xla" equals the reference kernel, forward and gradients; and
everything it refuses, before anything compiles. (cuDNN itself runs only on a GPU: not here.)"""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import models
from bert_jax.models import attention, kernels
from bert_jax.models.attention import Masking, UnsupportedAttention
from bert_jax.models.kernels.cudnn import CuDNN, cudnn_attention, dpa_attention
from bert_jax.models.kernels.xla import xla_attention
from bert_jax.models.masking import Pattern

mapped = functools.partial(dpa_attention, implementation="xla")


class Mapped(CuDNN):
    """The cudnn kernel's facts with the mapping run by XLA."""

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        return mapped(q_BTNK, k_BSNK, v_BSNK, masking, **options)


def qkv(B=3, T=16, N=2, K=8):
    return tuple(jax.random.normal(jax.random.key(i), (B, T, N, K)) for i in range(3))


def padded(lengths=(16, 11, 5), T=16, **flags):
    """Unpacked rows: one sequence each (id 1), then padding (0)."""
    seg = jnp.asarray([[1] * n + [0] * (T - n) for n in lengths], jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(T), seg.shape)
    return Masking(seg, seg, pos, pos, **flags)


def _value_and_grads(kernel, m, q, k, v):
    w = jax.random.normal(jax.random.key(9), q.shape)  # a loss that weighs every output

    def loss(q, k, v):
        return jnp.sum(kernel(q, k, v, m)[0] * w)
    return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v), kernel(q, k, v, m)[0]


@pytest.mark.parametrize("flags", [{}, {"causal": True}, {"causal": True, "window": 3}],
                         ids=["padding", "causal", "causal-window"])
def test_the_mapping_equals_xla_on_padded_rows_forward_and_gradients(flags):
    """Every output, the padding queries' included (they see the real keys, as in xla)."""
    q, k, v = qkv()
    m = padded(**flags)
    (ref_loss, ref_grads), ref = _value_and_grads(xla_attention, m, q, k, v)
    (loss, grads), out = _value_and_grads(mapped, m, q, k, v)
    np.testing.assert_allclose(out, ref, atol=2e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, atol=2e-5)


def test_a_row_of_padding_only_stays_finite():
    q, k, v = qkv(B=2)
    out, _ = mapped(q, k, v, padded(lengths=(16, 0)))
    assert np.isfinite(np.asarray(out)).all()


def test_global_layers_among_causal_windows_follow_a_traced_layer_index():
    """attention_global_every=2 under lax.scan: layers 0 and 2 global, 1 local, as xla."""
    q, k, v = qkv()
    m = padded(causal=True, window=2, pattern=Pattern(num_layers=3, global_every=2))

    def stack(kernel):
        def layer(x, i):
            out, _ = kernel(x, k, v, m.in_layer(i, 3))
            return out, out
        return jax.lax.scan(layer, q, jnp.arange(3))[1]

    np.testing.assert_allclose(jax.jit(lambda: stack(mapped))(), stack(xla_attention),
                               atol=2e-6)
    # a static layer index picks its mask without lax.cond
    for i in range(3):
        np.testing.assert_allclose(mapped(q, k, v, m.in_layer(i, 3))[0],
                                   xla_attention(q, k, v, m.in_layer(i, 3))[0], atol=2e-6)


def test_a_bert_model_runs_through_the_mapping(monkeypatch):
    """The model hands the kernel its padding as segment ids: a one-layer BERT's outputs with
    the mapping (registered as cudnn, run by XLA) equal the xla kernel's."""
    monkeypatch.setitem(kernels.KERNELS, "cudnn", Mapped())
    ids = jnp.asarray(np.random.RandomState(0).randint(5, 100, (2, 16)))
    mask = jnp.asarray([[1] * 16, [1] * 9 + [0] * 7])
    outs = {}
    for kernel in ("xla", "cudnn"):
        model = models.create_model(models.model_section(
            "bert", models.bert_model_fields("tiny"), num_layers=1, attention_kernel=kernel,
            attention_dropout_rate=0.0), seed=0)
        # jitted: one program per model (eager mode compiles every operation apart)
        outs[kernel] = nnx.jit(lambda m: m(ids, attention_mask=mask)["sequence_output"])(model)
    np.testing.assert_allclose(outs["cudnn"], outs["xla"], atol=1e-5)


def test_probabilities_and_incremental_decoding_go_to_xla_with_a_line(caplog):
    q, k, v = qkv()
    m = padded()
    kernels._SAID.clear()
    with caplog.at_level(logging.INFO, logger="bert_jax.models.kernels"):
        out, probs = cudnn_attention(q, k, v, m, return_probs=True)
        step = Masking(m.q_segment_ids[:, :1], m.kv_segment_ids, m.q_positions[:, :1],
                       m.kv_positions, q_offset=jnp.int32(3), causal=True)
        cudnn_attention(q[:, :1], k, v, step)
    assert probs.shape == (3, 2, 16, 16)
    np.testing.assert_allclose(out, xla_attention(q, k, v, m)[0], atol=1e-6)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["model.attention_kernel=cudnn: returning attention probabilities runs with "
                    "the xla kernel", "model.attention_kernel=cudnn: incremental decoding runs "
                    "with the xla kernel"]


def test_what_the_kernel_refuses_when_called():
    q, k, v = qkv()
    with pytest.raises(UnsupportedAttention, match="model.attention_kernel=cudnn needs a GPU"):
        cudnn_attention(q, k, v, padded())
    with pytest.raises(UnsupportedAttention, match="model.attention_dropout_rate=0.1 with "
                                                   "model.attention_kernel=cudnn"):
        cudnn_attention(q, k, v, padded(), dropout_rate=0.1, rng=jax.random.key(0))
    with pytest.raises(UnsupportedAttention, match="cuDNN's sliding window .* is causal only"):
        mapped(q, k, v, padded(window=2))
    with pytest.raises(UnsupportedAttention, match="model.attention_pattern=bigbird with "
                                                   "model.attention_kernel=cudnn"):
        mapped(q, k, v, padded(pattern=Pattern(block=4, window_blocks=1)))


def _cfg(family="bert", **fields):
    fields = {"attention_kernel": "cudnn", "attention_dropout_rate": 0.0, **fields}
    dtype = fields.pop("dtype", "bfloat16")  # a run's compute dtype, set at top level
    base = models.bert_model_fields("tiny") if family == "bert" else {}
    section = models.model_section(family, base, **fields)
    return models.split_model_config({**section, "dtype": dtype})[1]


@pytest.mark.parametrize("fields,training,says", [
    ({"attention_dropout_rate": 0.1}, True, "model.attention_dropout_rate=0.1 with "
                                            "model.attention_kernel=cudnn"),
    ({"dtype": "float32"}, False, "dtype=float32 with model.attention_kernel=cudnn"),
    ({"head_dim": 12}, False, "model.head_dim=12 with model.attention_kernel=cudnn"),
    ({"attention_window": 8}, False, "model.attention_window=8 with model.attention_kernel=cudnn"),
    ({"attention_pattern": "bigbird", "bigbird_block": 16}, False,
     "model.attention_pattern=bigbird with model.attention_kernel=cudnn"),
], ids=["dropout", "float32", "head-dim", "bidirectional-window", "bigbird"])
def test_what_cudnn_refuses_before_compiling(fields, training, says):
    with pytest.raises(UnsupportedAttention) as e:
        attention.check(_cfg(**fields), [128], training=training)
    assert says in str(e.value) and "model.attention_kernel=xla" in str(e.value)


def test_cudnn_passes_what_it_can_run_and_refuses_packed_rows_and_other_platforms():
    attention.check(_cfg(), [128, 512], training=True)
    attention.check(_cfg(attention_dropout_rate=0.1), [128], training=False)  # dropout unused
    attention.check(_cfg(attention_window=8, attention_global_every=3, family="decoder_lm"), [128],
                    training=True)  # causal windows: cuDNN's sliding window
    attention.check_data(_cfg(), packed=False)
    with pytest.raises(UnsupportedAttention, match="with data.pack=True: .* set data.pack=False"):
        attention.check_data(_cfg(), packed=True)
    with pytest.raises(UnsupportedAttention, match="the decoder-only models' batches"):
        attention.check_data(_cfg(family="decoder_lm"), packed=False)
    attention.check_platform("cudnn", "gpu")
    for platform, also in (("cpu", ""), ("tpu", " (or splash)")):
        with pytest.raises(UnsupportedAttention) as e:
            attention.check_platform("cudnn", platform)
        assert str(e.value) == (f"model.attention_kernel=cudnn needs a GPU (cuDNN flash attention), "
                                f"not {platform}; choose model.attention_kernel=xla{also}")
