"""Model library properties: masks, caches, packing, scan, jit, dtypes, sizes."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import models
from bert_jax.models import layers
from bert_jax.models.config import BertConfig, ModelConfig
from bert_jax.models.layers import dropout, sinusoidal_positions

TINY = dict(vocab_size=97, emb_dim=32, num_layers=2, num_heads=4, head_dim=8, mlp_dim=48,
            max_len=40)


def tiny(name, **kw):
    fields = dict(TINY)
    if name in ("transformer", "decoder_lm"):
        fields.update(models.transformer_model_fields("base", vocab_size=97), **TINY)
        fields.update(num_decoder_layers=2, dropout_rate=0.1)
    if name == "decoder_lm":
        fields.update(norm="pre", positions="learned", scale_embeddings=False)
    return models.model_section(name, fields, **kw)


def rand_ids(shape, seed=0, low=5, high=97):
    return jnp.asarray(np.random.RandomState(seed).randint(low, high, shape))


# The properties below hold for any execution; they run the model under nnx.jit, one program
# per input shape, which compiles ~3x cheaper than eager mode's one program per operation
# (test_jit_equals_eager keeps the eager call and checks the two agree).
encode = nnx.jit(lambda model, ids, mask=None, segments=None, positions=None: model.bert(
    ids, attention_mask=mask, segment_ids=segments, positions=positions)["sequence_output"])


def test_sinusoidal_table_is_the_paper_formula():
    d, positions = 10, np.arange(50)
    table = np.asarray(sinusoidal_positions(jnp.asarray(positions), d))
    for pos in positions:
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=2e-5)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=2e-5)


def test_padding_never_changes_real_tokens():
    model = models.create_model(tiny("bert_pretraining"))
    ids = rand_ids((1, 12))
    alone = encode(model, ids)
    # Three rows of one batch (one program, where a length each compiled three): 5, 6 and 7
    # random garbage tokens after the real ones, the rest of the row [PAD] (id 0).
    pads = [jnp.pad(rand_ids((1, 5 + seed), seed=seed + 10), ((0, 0), (0, 2 - seed)))
            for seed in range(3)]
    padded = jnp.concatenate([jnp.concatenate([ids, pad], axis=1) for pad in pads])
    mask = (jnp.arange(19) < 12).astype(jnp.int32)[None].repeat(3, 0)
    out = encode(model, padded, mask)
    np.testing.assert_allclose(out[:, :12], alone.repeat(3, 0), atol=1e-5)


@pytest.mark.parametrize("name", ["decoder_lm", "transformer"])
def test_future_tokens_never_change_earlier_outputs(name):
    model = models.create_model(tiny(name))
    src = rand_ids((2, 9), seed=1)
    a, b = rand_ids((2, 10), seed=2), rand_ids((2, 10), seed=3)
    b = b.at[:, :6].set(a[:, :6])  # same first 6 tokens, different future
    run = nnx.jit((lambda m, t: m(t)[0]) if name == "decoder_lm" else (lambda m, t: m(src, t)))
    run = lambda t, run=run: run(model, t)  # noqa: E731
    out_a, out_b = run(a), run(b)
    np.testing.assert_allclose(out_a[:, :6], out_b[:, :6], atol=1e-5)
    assert np.abs(out_a[:, 6:] - out_b[:, 6:]).max() > 1e-3  # the test can fail


@pytest.mark.parametrize("name", ["decoder_lm", "transformer"])
def test_incremental_decoding_matches_full_pass(name):
    model = models.create_model(tiny(name))
    src, tgt = rand_ids((2, 7), seed=4), rand_ids((2, 8), seed=5)
    if name == "decoder_lm":
        full, _ = nnx.jit(lambda m: m(tgt))(model)
        step = lambda t, cache, i: model(t, cache=cache, cache_index=i)
    else:
        full = nnx.jit(lambda m: m(src, tgt))(model)
        encoded = nnx.jit(lambda m: m.encode(src))(model)  # one program, as full is
        src_seg = jnp.ones_like(src)
        step = lambda t, cache, i: model.decode(t, encoded, src_seg, cache=cache,
                                                cache_index=i)
    cache = model.init_cache(2, 8)
    step = jax.jit(step)
    outs = []
    for i in range(8):
        logits, cache = step(tgt[:, i:i + 1], cache, jnp.int32(i))
        outs.append(logits)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_packed_segments_never_see_each_other():
    model = models.create_model(tiny("bert_pretraining"))
    a, b = rand_ids((1, 7), seed=6), rand_ids((1, 5), seed=7)
    packed = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], axis=1)
    segments = jnp.asarray([[1] * 7 + [2] * 5 + [0] * 3])
    positions = jnp.asarray([list(range(7)) + list(range(5)) + [0] * 3])
    out = encode(model, packed, segments=segments, positions=positions)
    np.testing.assert_allclose(out[:, :7], encode(model, a), atol=1e-5)
    np.testing.assert_allclose(out[:, 7:12], encode(model, b), atol=1e-5)


def test_packed_decoder_segments_are_causal_and_separate():
    model = models.create_model(tiny("decoder_lm"))
    a, b = rand_ids((1, 6), seed=8), rand_ids((1, 4), seed=9)
    packed = jnp.concatenate([a, b], axis=1)
    segments = jnp.asarray([[1] * 6 + [2] * 4])
    positions = jnp.asarray([list(range(6)) + list(range(4))])
    lm = nnx.jit(lambda m, t, segments=None, positions=None: m(
        t, segments_BT=segments, positions_BT=positions)[0])
    out = lm(model, packed, segments, positions)
    np.testing.assert_allclose(out[:, :6], lm(model, a), atol=1e-5)
    np.testing.assert_allclose(out[:, 6:], lm(model, b), atol=1e-5)


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
@pytest.mark.slow
def test_scan_equals_unrolled(remat):
    cfg = tiny("bert_pretraining", num_layers=3)
    unrolled = models.create_model(cfg)
    scanned = models.create_model(dict(cfg, scan_layers=True, remat_policy=remat))
    nnx.update(scanned, nnx.state(unrolled))  # same parameters: the layout does not change
    ids = rand_ids((2, 11), seed=10)

    def loss(model):
        return jnp.mean(model(ids, rng=jax.random.key(0))["mlm_logits"] ** 2)

    np.testing.assert_allclose(loss(scanned), loss(unrolled), rtol=1e-6)
    g_scan = nnx.state(nnx.grad(loss)(scanned), nnx.Param)
    g_loop = nnx.state(nnx.grad(loss)(unrolled), nnx.Param)
    for x, y in zip(jax.tree.leaves(g_scan), jax.tree.leaves(g_loop)):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-5)


def test_jit_equals_eager():
    model = models.create_model(tiny("bert_classification", num_labels=3))
    ids = rand_ids((3, 9), seed=11)
    graphdef, state = nnx.split(model)
    jitted = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)["logits"])
    np.testing.assert_allclose(jitted(state, ids), model(ids)["logits"], atol=1e-6)


def test_dropout_switch():
    model = models.create_model(tiny("bert_pretraining"))
    ids = rand_ids((2, 9), seed=12)
    logits = nnx.jit(lambda m, rng=None: m(ids, rng=rng)["mlm_logits"])
    det = logits(model)
    np.testing.assert_array_equal(det, logits(model))
    a = logits(model, jax.random.key(1))
    b = logits(model, jax.random.key(2))
    assert np.abs(a - det).max() > 1e-3 and np.abs(a - b).max() > 1e-3
    np.testing.assert_array_equal(a, logits(model, jax.random.key(1)))


@pytest.mark.parametrize("rate,shape", [(0.1, (333, 301)), (0.5, (7, 3, 1001)), (0.3, (1,))])
def test_dropout_drops_the_rate_and_keeps_the_mean(rate, shape):
    """16 random bits per element: the dropped fraction is the rate (to 1/65536 and sampling
    noise), kept elements are scaled so the mean is unchanged, odd sizes work."""
    x = jnp.ones(shape)
    y = np.asarray(dropout(x, rate, jax.random.key(3)))
    assert y.shape == shape
    kept = y > 0
    np.testing.assert_allclose(y[kept], 1 / (1 - round(rate * 65536) / 65536), rtol=1e-6)
    if y.size > 1000:
        sigma = np.sqrt(rate * (1 - rate) / y.size)
        assert abs((1 - kept.mean()) - rate) < 5 * sigma
        assert abs(y.mean() - 1) < 5 * sigma / (1 - rate)
    # Different keys drop different elements; the same key the same ones.
    np.testing.assert_array_equal(y, dropout(x, rate, jax.random.key(3)))
    if y.size > 1:
        assert (y != np.asarray(dropout(x, rate, jax.random.key(4)))).any()


@pytest.mark.parametrize("spec,shapes", [
    ("btnk,bsnk->bnts", ((2, 5, 3, 4), (2, 6, 3, 4))),  # attention logits
    ("bnts,bsnk->btnk", ((2, 3, 5, 6), (2, 6, 3, 4))),  # attention output (the dV order XLA CPU trips on)
    ("abc,cde->abde", ((2, 5, 8), (8, 3, 4))),  # a dense layer (LinearGeneral's dot_general)
    ("ab,cb->ac", ((7, 8), (11, 8))),  # logits against the embedding table
])
def test_bf16_matmul_and_its_gradients_match_the_float32_einsum(spec, shapes):
    """bfloat16 dots on CPU run as f32-accumulating dots with a custom VJP: values and both
    gradients equal float32 einsum's on the same bf16 inputs, to bf16 rounding."""
    a, b = (jax.random.normal(jax.random.key(i), s).astype(jnp.bfloat16) for i, s in enumerate(shapes))

    def loss(fn, x, y):
        return jnp.sum(jnp.sin(fn(spec, x, y).astype(jnp.float32)))

    got = jax.value_and_grad(lambda x, y: loss(layers.matmul, x, y), argnums=(0, 1))(a, b)
    want = jax.value_and_grad(lambda x, y: loss(jnp.einsum, x, y), argnums=(0, 1))(
        a.astype(jnp.float32), b.astype(jnp.float32))
    np.testing.assert_allclose(got[0], want[0], rtol=2e-2, atol=2e-2)
    for g, w in zip(got[1], want[1]):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(jnp.float32), w, rtol=3e-2, atol=3e-2)


def test_heads_shapes():
    ids = rand_ids((2, 10), seed=13)

    def outputs(cfg, ids=ids):  # shapes only: traced, nothing computed
        return nnx.eval_shape(lambda m: m(ids), models.abstract_model(cfg))

    assert outputs(tiny("bert_tagging", num_labels=5))["logits"].shape == (2, 10, 5)
    span = outputs(tiny("bert_span"))
    assert span["start_logits"].shape == span["end_logits"].shape == (2, 10)
    choice = outputs(tiny("bert_choice"), rand_ids((2, 4, 10)))
    assert choice["logits"].shape == (2, 4)
    assert outputs(tiny("bert_classification", num_labels=1))["logits"].shape == (2, 1)


def test_bfloat16_compute_keeps_float32_params():
    cfg = tiny("bert_pretraining")
    f32 = models.create_model(cfg)
    bf16 = models.create_model(dict(cfg, dtype="bfloat16"))
    assert {x.dtype for x in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype("float32")}
    ids = rand_ids((2, 9), seed=14)
    logits = nnx.jit(lambda m: m(ids)["mlm_logits"])
    out = logits(bf16)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, logits(f32), atol=0.05)


def test_every_parameter_has_logical_axes():
    allowed = {"vocab", "embed", "mlp", "heads", "kv", "layers", None}
    for name in ("bert_pretraining", "bert_choice", "transformer", "decoder_lm"):
        state = nnx.state(models.abstract_model(tiny(name)), nnx.Param)
        for path, var in jax.tree_util.tree_leaves_with_path(
                state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
            axes = var.get_metadata().get("out_sharding")
            assert axes is not None and len(axes) == len(var.get_value().shape), (name, path)
            assert set(axes) <= allowed, (name, path, axes)


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="model.norm='middle'"):
        ModelConfig(norm="middle")
    with pytest.raises(ValueError, match="unknown model config key.*'hidden_size'"):
        models.create_model({"name": "bert", "hidden_size": 8})
    with pytest.raises(ValueError, match="model.name='gpt'"):
        models.create_model({"name": "gpt"})


def _layer(d, f, cross=False):
    """Closed-form parameters of one post-LN layer: attention(s), FFN, LayerNorms."""
    attn = 4 * (d * d + d)
    return (2 if cross else 1) * attn + (2 * d * f + f + d) + (3 if cross else 2) * 2 * d


@pytest.mark.parametrize("size,published,layers,d,vocab", [
    ("base", 110e6, 12, 768, 30522), ("large", 340e6, 24, 1024, 30522)])
def test_bert_parameter_counts(size, published, layers, d, vocab):
    model = models.abstract_model(models.model_section("bert", models.bert_model_fields(size)))
    total = models.param_counts(model)["total"]
    embeddings = (vocab + 512 + 2) * d + 2 * d
    assert total == embeddings + layers * _layer(d, 4 * d) + d * d + d
    assert abs(total / published - 1) < 0.02


@pytest.mark.parametrize("size,published,tolerance,d,f", [
    # 37k vocab: big lands 0.6% from the paper's 213M. Base lands 2.95% under its 65M: the
    # paper's two counts imply different vocabulary sizes (~40.7k vs ~36.7k), see models.py.
    ("big", 213e6, 0.02, 1024, 4096), ("base", 65e6, 0.03, 512, 2048)])
def test_transformer_parameter_counts(size, published, tolerance, d, f):
    model = models.abstract_model(dict(name="transformer", **models.transformer_model_fields(size)))
    total = models.param_counts(model)["total"]
    assert total == 37000 * d + 6 * _layer(d, f) + 6 * _layer(d, f, cross=True)
    assert abs(total / published - 1) < tolerance


def test_flops_per_token_matches_xla_cost_analysis():
    cfg = dict(tiny("bert"), emb_dim=256, num_heads=4, head_dim=64, mlp_dim=1024,
               use_pooler=False)
    graphdef, state = nnx.split(models.abstract_model(cfg))  # shapes: lowered, never run
    T = 64
    ids = jnp.zeros((1, T), jnp.int32)
    fn = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)["sequence_output"])
    cost = fn.lower(state, ids).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    analytic = models.flops_per_token(cfg, T)["encoder_per_token"] * T
    assert 0.9 < cost["flops"] / analytic < 1.15, (cost["flops"], analytic)


def test_model_config_roundtrips_through_fields():
    fields = models.bert_model_fields("tiny")
    assert dataclasses.asdict(BertConfig(**fields)) == fields
