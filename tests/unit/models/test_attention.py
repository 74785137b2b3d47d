"""The attention seam (bert_jax/models/attention.py, masking.py, kernels/): what a Masking
allows, checked against a plain loop; the kernel registry, its error, and a kernel registered
from this file alone; the models hand kernels segment ids and positions, never a dense mask."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import REPO

from bert_jax import models
from bert_jax.models import attention, kernels
from bert_jax.models.kernels.xla import dense_mask, xla_attention
from bert_jax.models.masking import Masking, Pattern, bigbird_blocks

SMALL = dict(vocab_size=128, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64)
PACKAGE = REPO / "bert_jax"


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
    np.testing.assert_array_equal(np.asarray(dense_mask(m)),
                                  _loop_mask(q_seg, kv_seg, causal=causal, window=window,
                                             q_offset=q_offset))


def test_explicit_softmax_path_equals_the_fused_one():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 3, 4)) for i in range(3))
    seg = jnp.asarray([[1, 1, 2, 2, 0], [1, 1, 1, 1, 1]])
    pos = jnp.asarray([[0, 1, 0, 1, 0], [0, 1, 2, 3, 4]])
    m = Masking(seg, seg, pos, pos, causal=True)
    fast, none = xla_attention(q, k, v, m)
    assert none is None
    # Probabilities asked for force the explicit path; so does any dropout rate.
    explicit, probs = xla_attention(q, k, v, m, return_probs=True)
    np.testing.assert_allclose(explicit, fast, atol=1e-5)
    tiny_drop, _ = xla_attention(q, k, v, m, dropout_rate=1e-12, rng=jax.random.key(0))
    np.testing.assert_allclose(tiny_drop, fast, atol=1e-5)
    assert probs.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    # Packed segments never see each other; causal rows see no later key.
    p = np.asarray(probs)
    assert (p[0, :, :2, 2:] == 0).all() and (p[0, :, 2:4, :2] == 0).all()
    assert (np.triu(p[1], k=1) == 0).all()


@pytest.mark.parametrize("causal,block,traced", [(False, 0, False), (True, 0, False),
                                                  (False, 2, False), (False, 0, True)])
def test_a_short_window_runs_banded_with_the_dense_results(monkeypatch, causal, block, traced):
    """A window much shorter than the row is computed on the key blocks near each query block
    (xla.banded): outputs and the gradients of q, k and v are the dense masked computation's,
    with packed sequences, padding (its last queries see no key within the window: the dense
    softmax gives them the mean of all values) and a length no block divides; block 2: a
    block below the window (two blocks each side); traced: scan_layers' traced layer index,
    a global layer (dense) and a local one (banded)."""
    from bert_jax.models.kernels import xla

    B, T, N, K, W = 2, 43, 2, 4, 5
    q, k, v, ct = (jax.random.normal(jax.random.key(i), (B, T, N, K)) for i in range(4))
    seg = np.zeros((B, T), np.int32)
    seg[0, :12], seg[0, 12:30], seg[1, :33] = 1, 2, 1
    pos = np.concatenate([np.arange(12), np.arange(18), np.zeros(13, int)])
    pos = jnp.asarray(np.stack([pos, np.where(seg[1] > 0, np.arange(T), 0)]))
    m = Masking(jnp.asarray(seg), jnp.asarray(seg), pos, pos, causal=causal, window=W,
                pattern=Pattern(num_layers=3, global_every=3) if traced else None)
    monkeypatch.setattr(xla, "BAND_BLOCK", block)
    assert xla.band_block(m, T, T) == (block or W)

    def run(q, k, v, layer):
        out, _ = xla_attention(q, k, v, m.in_layer(layer, 3))
        return out, jax.grad(lambda *x: (xla_attention(*x, m.in_layer(layer, 3))[0] * ct).sum(),
                             argnums=(0, 1, 2))(q, k, v)

    for layer in (0, 1) if traced else (1,):
        banded = jax.jit(lambda *a: run(*a))(q, k, v, layer)  # a new trace each (jit caches)
        with monkeypatch.context() as patch:
            patch.setattr(xla, "band_block", lambda *_: None)
            dense = jax.jit(lambda *a: run(*a))(q, k, v, layer)
        for got, want in zip(jax.tree.leaves(banded), jax.tree.leaves(dense), strict=True):
            np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    assert not np.asarray(dense_mask(m.in_layer(1, 3))[1, 0, -1]).any()  # a query seeing nothing


def test_unknown_kernel_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"model.attention_kernel='flash'.*\['cudnn', 'splash', 'xla'\]"):
        models.create_model(models.model_section("bert", models.bert_model_fields("tiny"),
                                                 attention_kernel="flash"))


class CountingKernel(kernels.Kernel):
    """A toy kernel registered from this file alone: the xla kernel, counting its calls."""

    name = "counting"

    def __init__(self):
        self.calls = 0

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        self.calls += 1
        return kernels.get("xla")(q_BTNK, k_BSNK, v_BSNK, masking, **options)


@pytest.fixture
def counting():
    kernel = kernels.register(CountingKernel())
    yield kernel
    kernels.KERNELS.pop(kernel.name)


TINY_TRAIN = ["train", "--config", "configs/bert_pretrain.py:tiny", "--config.data.name=synthetic",
              "--config.train.batch_size=8", "--config.model.num_layers=2",
              "--config.model.emb_dim=16", "--config.model.num_heads=2", "--config.model.head_dim=8",
              "--config.model.mlp_dim=32", "--config.model.vocab_size=100",
              "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=2",
              "--config.train.steps=1", "--config.train.eval_steps=1",
              "--config.schedule.warmup_steps=1", "--config.model.attention_kernel=counting"]


def test_a_kernel_registered_by_a_test_runs_a_model_and_trains_a_step(counting, cli, tmp_path):
    """No library edit: the model config accepts the new name, the layer calls it (once per
    layer), its outputs are the xla kernel's; `bert-jax train` runs a step through it."""
    ids = jnp.asarray(np.random.RandomState(0).randint(5, 100, (2, 16)))
    outs = {}
    for name in ("xla", "counting"):
        model = models.create_model(models.model_section(
            "bert", models.bert_model_fields("tiny"), **SMALL, attention_kernel=name), seed=0)
        # jitted (one program, not one per operation): traced once, so one call per layer
        outs[name] = nnx.jit(lambda m: m(ids)["sequence_output"])(model)
    assert counting.calls == 2  # the tiny BERT's two layers
    np.testing.assert_array_equal(outs["counting"], outs["xla"])
    counting.calls = 0
    code, _, err = cli(TINY_TRAIN + ["--workdir", str(tmp_path / "w")])
    assert code == 0, err
    assert counting.calls > 0  # traced into the train step
    assert (tmp_path / "w" / "metrics.jsonl").exists()


def test_an_unregistered_kernel_is_refused_as_before(cli, tmp_path):
    """Once a kernel is gone from the registry, naming it is the error any unknown name gets."""
    kernel = kernels.register(CountingKernel())
    kernels.KERNELS.pop(kernel.name)
    says = "model.attention_kernel='counting'; choose one of ['cudnn', 'splash', 'xla']"
    with pytest.raises(attention.UnsupportedAttention, match=re.escape(says)):
        models.create_model(models.model_section("bert", models.bert_model_fields("tiny"),
                                                 attention_kernel="counting"))
    code, _, err = cli(TINY_TRAIN + ["--workdir", str(tmp_path / "w")])
    assert code == 1 and says in err, err
    assert not (tmp_path / "w" / "checkpoints").exists()  # refused before anything ran


def test_kernel_facts_and_flops():
    """What each built-in kernel declares; the default FLOPs are the pattern's keys (as the
    model's FLOPs count them), splash's its visited tiles; `plan` adds only the opaque ones."""
    xla, splash, cudnn = (kernels.get(n) for n in ("xla", "splash", "cudnn"))
    assert (xla.platforms, splash.platforms, cudnn.platforms) == (None, ("tpu", "cpu"), ("gpu",))
    assert [k.reads_block_size for k in (xla, splash, cudnn)] == [False, True, False]
    assert not xla.opaque and splash.opaque
    cfg = models.split_model_config(models.model_section(
        "bert", models.bert_model_fields("tiny"), **SMALL, num_layers=3))[1]
    dense = 2 * 2 * 256 * 2 * 16 * 256 * 4 * 3  # QK^T and PV, 256 keys, 2 heads of 16, 4 rows
    assert xla.flops(cfg, 4, 256, training=False) == dense
    assert xla.flops(cfg, 4, 256, training=True) == 3 * dense
    assert splash.flops(cfg, 4, 256, training=False) == dense  # full: every tile, 2 matmuls
    windowed = dataclasses.replace(cfg, attention_window=8, attention_global_every=2)
    local = 2 * 2 * 17 * 2 * 16 * 256 * 4  # 2W+1 keys in layer 1; layers 0 and 2 global
    assert xla.flops(windowed, 4, 256, training=False) == 2 * dense / 3 + local
    assert xla.options(windowed) == {} and splash.options(windowed) == {"blocks": windowed}


def test_every_kernel_has_the_reference_signature():
    q = k = v = jnp.ones((1, 128, 2, 8))  # splash tiles in multiples of 128
    seg, pos = jnp.ones((1, 128), jnp.int32), jnp.arange(128)[None]
    for name, fn in kernels.KERNELS.items():
        if jax.default_backend() not in (fn.platforms or (jax.default_backend(),)):
            with pytest.raises(attention.UnsupportedAttention, match=f"{name} needs a GPU"):
                fn(q, k, v, Masking(seg, seg, pos, pos))
            continue
        # traced for the output shapes (splash's interpret mode would run tile by tile)
        out, probs = jax.eval_shape(lambda fn=fn: fn(q, k, v, Masking(seg, seg, pos, pos),
                                                      dropout_rate=0.0, rng=None, return_probs=False))
        assert out.shape == (1, 128, 2, 8) and probs is None, name


def test_dense_masks_live_only_in_the_kernels():
    """The models pass segment ids and positions; only kernels (models/kernels/) build a
    [B, 1, T, S] mask."""
    assert "def dense_mask" in (PACKAGE / "models" / "kernels" / "xla.py").read_text()
    for path in (PACKAGE / "models").glob("*.py"):
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
        encode = nnx.jit(lambda m, x: m(x)["sequence_output"][0])  # one program for both
        a, b = (encode(model, x) for x in (ids, changed))
        moved[window] = np.flatnonzero(np.abs(np.asarray(a - b)).max(-1) > 1e-6).tolist()
    assert moved == {0: list(range(16)), 2: [13, 14, 15]}


def _pattern_loop(q_pos, kv_pos, seg, *, window=None, layer=0, pattern=None):
    """The patterns one (query, key) pair at a time: a window whose global layers (layer %
    every == 0) see everything; BigBird's neighbouring blocks, its random blocks (the table) and
    the tokens at positions below block * global_blocks (global within their sequence)."""
    base = _loop_mask(seg, seg)
    B, T = seg.shape
    out = np.zeros_like(base)
    for b in range(B):
        for t in range(T):
            for s in range(T):
                ok = base[b, 0, t, s]
                if window is not None and not (pattern.global_every and layer % pattern.global_every == 0):
                    ok = ok and abs(t - s) <= window
                if pattern is not None and pattern.block:
                    size = pattern.block
                    table = bigbird_blocks(pattern, layer, -(-T // size))
                    first = size * pattern.global_blocks
                    ok = ok and (abs(t // size - s // size) <= pattern.window_blocks
                                 or table[t // size, s // size]
                                 or q_pos[b, t] < first or kv_pos[b, s] < first)
                out[b, 0, t, s] = ok
    return out


@pytest.mark.parametrize("window,pattern,layer", [
    (2, Pattern(num_layers=4, global_every=3), 0),
    (2, Pattern(num_layers=4, global_every=3), 1),
    (None, Pattern(num_layers=2, block=2, window_blocks=1, global_blocks=1, random_blocks=1), 0),
    (None, Pattern(num_layers=2, block=2, window_blocks=0, global_blocks=1, random_blocks=2), 1),
], ids=["global-layer", "local-layer", "bigbird-layer0", "bigbird-layer1"])
def test_pattern_dense_masks_are_what_the_patterns_say(window, pattern, layer):
    """Packed rows: each sequence's first block (by position) is global within it."""
    seg = np.array([[1] * 5 + [2] * 5 + [0] * 2, [1] * 12])
    pos = np.array([[*range(5), *range(5), 0, 0], list(range(12))])
    m = Masking(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(pos), jnp.asarray(pos),
                window=window, pattern=pattern, layer=layer)
    np.testing.assert_array_equal(np.asarray(dense_mask(m)),
                                  _pattern_loop(pos, pos, seg, window=window, layer=layer,
                                                pattern=pattern))


def test_bigbird_random_blocks_are_fixed_per_layer_and_outside_the_window():
    p = Pattern(num_layers=3, block=64, window_blocks=1, global_blocks=1, random_blocks=3)
    tables = [bigbird_blocks(p, layer, 16) for layer in range(3)]
    np.testing.assert_array_equal(tables[1], bigbird_blocks(p, 1, 16))  # fixed
    assert not np.array_equal(tables[0], tables[1])  # per layer
    idx = np.arange(16)
    near = np.abs(idx[:, None] - idx[None, :]) <= 1
    random = tables[0] & ~near
    assert (random[1:].sum(1) == 3).all() and not random[0].any()  # the global block draws none
    assert not random[:, 0].any()  # nor is a global block drawn


def test_scanned_and_unrolled_stacks_see_the_same_per_layer_patterns():
    """scan_layers traces the layer index: each layer still gets its own random blocks and
    global layers, so both executions compute the same outputs."""
    ids = jnp.asarray(np.random.RandomState(0).randint(5, 100, (2, 32)))
    outs = {}
    for fields in ({"attention_pattern": "bigbird", "bigbird_block": 4, "bigbird_random_blocks": 2},
                   {"attention_window": 3, "attention_global_every": 2}):
        for scan in (False, True):
            model = models.create_model(models.model_section(
                "bert", models.bert_model_fields("tiny"), **SMALL, num_layers=3, scan_layers=scan,
                **fields))
            outs[scan] = np.asarray(jax.jit(lambda x, model=model: model(x)["sequence_output"])(ids))
        np.testing.assert_allclose(outs[True], outs[False], atol=2e-6, err_msg=str(fields))


def _linformer(**fields):
    return models.create_model(models.model_section(
        "bert_pretraining", models.bert_model_fields("tiny"), **SMALL, num_layers=1, max_len=32,
        attention_pattern="linformer", linformer_k=8, dropout_rate=0.0, **fields))


def test_linformer_trains_a_step_and_ignores_padding():
    """Its [max_len, k] projection is a parameter of each layer and gets gradients; padded keys
    are zeroed before the projection, so the real tokens' outputs ignore what the padding holds."""
    model = _linformer()
    E = model.bert.encoder.layers.attention.linformer
    assert E.shape == (1, 32, 8)
    ids = jnp.asarray(np.random.RandomState(0).randint(5, 100, (2, 32)))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params, ids, mask):
        out = nnx.merge(graphdef, params)(ids, attention_mask=mask)
        return jnp.mean(jax.nn.log_softmax(out["mlm_logits"])[..., 7])

    full = jnp.ones_like(ids)
    value, grads = jax.jit(jax.value_and_grad(loss))(params, ids, full)
    assert np.isfinite(value)
    assert np.abs(np.asarray(grads["bert"]["encoder"]["layers"]["attention"]["linformer"][...])).max() > 0
    padded = full.at[:, 20:].set(0)
    other = ids.at[:, 20:].set(3)
    run = jax.jit(lambda x, m: model.bert(x, attention_mask=m)["sequence_output"])
    np.testing.assert_allclose(run(ids, padded)[:, :20], run(other, padded)[:, :20], atol=1e-5)


def test_linformer_is_for_the_bert_models():
    """A decoder's causal attention cannot mix every position into its keys."""
    with pytest.raises(ValueError, match="model.attention_pattern=linformer: decoder-only models"):
        models.split_model_config(models.model_section(
            "decoder_lm", models.transformer_model_fields("base"), attention_pattern="linformer"))
