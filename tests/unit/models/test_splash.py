"""The splash attention kernel (models/kernels/splash.py) against the xla reference on CPU, where it
runs in Pallas interpret mode: forward and gradients on packed encoder rows with padding,
causal decoder rows and local windows, bfloat16 within a stated tolerance; a BERT train step
through the sharded train step (shard_map over data, fsdp and tensor); the encoder-decoder
(whose cross-attention runs with xla); what splash hands to xla and what it refuses."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.models import attention, kernels
from bert_jax.models.attention import Masking, UnsupportedAttention
from bert_jax.models.kernels.splash import (
    _splash_mask,
    block_sizes,
    mask_info_bytes,
    smem_error,
    splash_attention,
    splash_blocks,
    splash_flops,
)
from bert_jax.models.kernels.xla import xla_attention
from bert_jax.models.masking import Pattern
from bert_jax.training import input as pipelines
from bert_jax.training import objectives, optim, sharding, state, train

B, T, N, K = 2, 256, 2, 64  # splash tiles are multiples of 128: two 128-blocks per row
# Row 0: two packed sequences, then padding; row 1: one sequence and a little padding.
SEG = np.zeros((B, T), np.int32)
SEG[0, :100], SEG[0, 100:200], SEG[1, :250] = 1, 2, 1
POS = np.zeros((B, T), np.int32)
for b in range(B):
    for s in np.unique(SEG[b][SEG[b] > 0]):
        POS[b, SEG[b] == s] = np.arange((SEG[b] == s).sum())
REAL = SEG > 0  # the outputs a loss may read


def qkv(dtype=jnp.float32):
    return tuple(jax.random.normal(jax.random.key(i), (B, T, N, K)).astype(dtype) for i in range(3))


def masking(causal=False, window=None) -> Masking:
    return Masking(jnp.asarray(SEG), jnp.asarray(SEG), jnp.asarray(POS), jnp.asarray(POS),
                   causal=causal, window=window)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 40), (True, 40)],
                         ids=["encoder", "decoder", "encoder-window", "decoder-window"])
def test_splash_equals_xla_forward_and_gradients(causal, window):
    q, k, v = qkv()
    m = masking(causal, window)
    # A loss over the non-padding outputs only, as every objective's weights make it.
    w = jax.random.normal(jax.random.key(9), (B, T, N, K)) * REAL[:, :, None, None]

    def run(kernel):
        def loss(q, k, v):
            out, _ = kernel(q, k, v, m)
            return jnp.sum(out * w), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (loss_x, out_x), grads_x = run(xla_attention)
    (loss_s, out_s), grads_s = run(splash_attention)
    np.testing.assert_allclose(np.asarray(out_s)[REAL], np.asarray(out_x)[REAL], atol=2e-6)
    if not causal and window is None:  # an unpacked row: padding outputs equal xla's too
        np.testing.assert_allclose(out_s[1], out_x[1], atol=2e-6)
    np.testing.assert_allclose(loss_s, loss_x, rtol=1e-5)
    for name, gs, gx in zip("qkv", grads_s, grads_x, strict=True):
        np.testing.assert_allclose(gs, gx, atol=2e-5, err_msg=f"d loss / d {name}")


# One unpacked sequence per row (splash's bigbird globals are each row's first blocks).
UNPACKED = (np.arange(T)[None, :] < np.array([[200], [T]])).astype(np.int32)
GLOBAL_EVERY = Pattern(num_layers=3, global_every=3)
BIGBIRD = Pattern(num_layers=3, block=64, window_blocks=0, global_blocks=1,
                            random_blocks=1)


@pytest.mark.parametrize("seg,window,pattern,layers", [
    (SEG, 40, GLOBAL_EVERY, (0, 1)), (UNPACKED, None, BIGBIRD, (2,))],
    ids=["local-with-global-layers", "bigbird"])
def test_splash_equals_xla_on_patterns_forward_and_gradients(seg, window, pattern, layers):
    """The layer index traced, as scan_layers makes it: splash picks its layer's static mask
    with lax.switch (a global and a local layer); bigbird's blocks run block sparse."""
    q, k, v = qkv()
    pos = np.where(seg > 0, np.arange(T), 0) if pattern.block else POS
    real = seg > 0
    w = jax.random.normal(jax.random.key(9), (B, T, N, K)) * real[:, :, None, None]

    def run(kernel, layer):
        def loss(q, k, v, layer):
            m = Masking(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(pos), jnp.asarray(pos),
                        window=window, pattern=pattern, layer=layer)
            out, _ = kernel(q, k, v, m)
            return jnp.sum(out * w), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v, layer)

    for layer in layers:
        (loss_x, out_x), grads_x = run(xla_attention, layer)
        (loss_s, out_s), grads_s = run(splash_attention, layer)
        np.testing.assert_allclose(np.asarray(out_s)[real], np.asarray(out_x)[real], atol=2e-6)
        np.testing.assert_allclose(loss_s, loss_x, rtol=1e-5)
        for name, gs, gx in zip("qkv", grads_s, grads_x, strict=True):
            np.testing.assert_allclose(gs, gx, atol=2e-5, err_msg=f"layer {layer}: d loss / d {name}")


def test_splash_in_bfloat16_is_as_close_to_float32_as_xla_is():
    """Both bfloat16 kernels against the float32 reference, on the non-padding outputs: within
    2e-2 (measured 5.3e-3 for splash, 6.6e-3 for xla: inputs and outputs rounded to bfloat16's
    8 bits, float32 accumulation inside)."""
    m = masking()
    ref, _ = xla_attention(*qkv(), m)
    out_x, _ = jax.jit(lambda *a: xla_attention(*a, m))(*qkv(jnp.bfloat16))
    out_s, _ = jax.jit(lambda *a: splash_attention(*a, m))(*qkv(jnp.bfloat16))
    assert out_s.dtype == jnp.bfloat16
    err_s = np.abs(np.asarray(out_s, np.float32) - np.asarray(ref))[REAL].max()
    err_x = np.abs(np.asarray(out_x, np.float32) - np.asarray(ref))[REAL].max()
    assert err_s < 2e-2 and err_x < 2e-2, (err_s, err_x)


def _tiny_pretraining(kernel: str):
    return config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), [
        "data.name=synthetic", "train.batch_size=8", "data.max_seq_length=128",
        "data.max_predictions_per_seq=8", "model.vocab_size=128", "model.num_layers=1",
        "model.emb_dim=32", "model.num_heads=2", "model.head_dim=16", "model.mlp_dim=64",
        "model.attention_dropout_rate=0.0", f"model.attention_kernel={kernel}",
        "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2", "train.steps=2",
        "schedule.warmup_steps=1"])


@pytest.mark.slow
def test_a_sharded_bert_train_step_with_splash_equals_xla():
    """The real train step (train.jit_train_step) on the 8-device mesh: batch over data x fsdp,
    the two heads over tensor, so splash runs per shard under shard_map."""
    metrics = {}
    for kernel in ("xla", "splash"):
        cfg = _tiny_pretraining(kernel)
        config_lib.validate(cfg, jax.device_count())
        mesh = sharding.make_mesh(cfg.mesh)
        objective = objectives.for_config(cfg)
        tx, schedule = optim.make_optimizer(cfg)
        graphdef, _, state_sh = state.abstract_state(cfg, mesh, tx)
        with jax.set_mesh(mesh):
            train_state = state.init_state(cfg, tx, state_sh)
            step = train.jit_train_step(cfg, graphdef, objective, tx, schedule, mesh, state_sh)
            batch = sharding.global_batch(next(pipelines.make(cfg, "train")), mesh, 1)
            assert (batch["attention_mask"] == 0).any()  # padding in the rows
            _, m = step(train_state, batch)
        metrics[kernel] = {k: float(v) for k, v in m.items() if k.endswith("loss")}
    assert metrics["splash"].keys() == metrics["xla"].keys() and metrics["xla"]
    for name, value in metrics["xla"].items():
        assert metrics["splash"][name] == pytest.approx(value, rel=1e-5), name


def test_the_encoder_decoder_with_splash_equals_xla():
    """Encoder self-attention and causal decoder self-attention in splash; cross-attention
    (where a decoder query may have no key to see) goes to xla."""
    section = {"name": "transformer", **dict(vocab_size=64, emb_dim=32, num_layers=1, num_heads=2,
                                             head_dim=16, mlp_dim=64, dropout_rate=0.0,
                                             attention_dropout_rate=0.0)}
    src = jnp.asarray(np.random.RandomState(0).randint(1, 64, (2, 128)) * (np.arange(128) < 100))
    tgt = jnp.asarray(np.random.RandomState(1).randint(1, 64, (2, 128)) * (np.arange(128) < 90))
    logits = {}
    for kernel in ("xla", "splash"):
        model = models.create_model({**section, "attention_kernel": kernel}, seed=0)
        logits[kernel] = np.asarray(jax.jit(lambda s, t, model=model: model(s, t))(src, tgt))
    real = np.asarray(tgt) > 0
    np.testing.assert_allclose(logits["splash"][real], logits["xla"][real], atol=2e-5)


def test_what_splash_hands_to_xla(caplog):
    """Probabilities (the `attention` command), incremental decoding (queries != keys, or an
    offset), cross-attention and lengths splash cannot tile run with xla, saying so once."""
    q, k, v = (jax.random.normal(jax.random.key(i), (B, 4, N, K)) for i in range(3))
    seg, pos = jnp.ones((B, 4), jnp.int32), jnp.broadcast_to(jnp.arange(4), (B, 4))
    self_m = Masking(seg, seg, pos, pos)
    with caplog.at_level(logging.INFO, logger="bert_jax.models.kernels"):
        kernels._SAID.clear()
        out, probs = splash_attention(q, k, v, self_m, return_probs=True)
        ref, ref_probs = xla_attention(q, k, v, self_m, return_probs=True)
        np.testing.assert_array_equal(out, ref)
        np.testing.assert_array_equal(probs, ref_probs)
        splash_attention(q, k, v, self_m, return_probs=True)
        cross = Masking(seg, seg, pos, pos, cross=True)
        np.testing.assert_array_equal(splash_attention(q, k, v, cross)[0],
                                      xla_attention(q, k, v, cross)[0])
        step = Masking(seg[:, :1], seg, pos[:, :1], pos, q_offset=jnp.int32(2), causal=True)
        np.testing.assert_array_equal(splash_attention(q[:, :1], k, v, step)[0],
                                      xla_attention(q[:, :1], k, v, step)[0])
        # 4 tokens: no 128-multiple tile (`features` and `translate` bring any length)
        np.testing.assert_array_equal(splash_attention(q, k, v, self_m)[0],
                                      xla_attention(q, k, v, self_m)[0])
    said = [r.getMessage() for r in caplog.records]
    assert said == ["model.attention_kernel=splash: returning attention probabilities runs with "
                    "the xla kernel", "model.attention_kernel=splash: cross-attention runs with "
                    "the xla kernel", "model.attention_kernel=splash: incremental decoding runs "
                    "with the xla kernel", "model.attention_kernel=splash: a length of 4 (not in "
                    "128-multiple tiles) runs with the xla kernel"]


def _cfg(**fields):
    return models.split_model_config(models.model_section("bert", models.bert_model_fields("tiny"),
                                                          **fields))[1]


@pytest.mark.parametrize("fields,length,training,says", [
    ({"attention_kernel": "splash"}, 512, True, "model.attention_dropout_rate=0.1 with "
                                                "model.attention_kernel=splash"),
    ({"attention_kernel": "splash", "attention_dropout_rate": 0.0}, 200, False,
     "min(model.attention_block_size=128, 200)"),
    ({"attention_kernel": "splash", "attention_dropout_rate": 0.0}, 64, False,
     "min(model.attention_block_size=128, 64)"),
    ({"attention_kernel": "splash", "attention_dropout_rate": 0.0, "attention_block_size": 96},
     384, False, "model.attention_block_size=96"),
    ({"attention_window": 512}, 512, False, "model.attention_window=512"),
], ids=["dropout", "block-not-dividing", "shorter-than-a-tile", "block-not-128", "window"])
def test_what_splash_and_windows_refuse_before_compiling(fields, length, training, says):
    with pytest.raises(UnsupportedAttention) as e:
        attention.check(_cfg(**fields), [length], training=training)
    assert says in str(e.value)


def test_splash_passes_the_checks_it_can_run_and_refuses_gpu():
    attention.check(_cfg(attention_kernel="splash"), [512, 128], training=False)  # dropout unused
    attention.check(_cfg(attention_kernel="splash", attention_dropout_rate=0.0), [512, 2048],
                    training=True)
    attention.check_platform("splash", "tpu")
    attention.check_platform("xla", "gpu")
    with pytest.raises(UnsupportedAttention, match="not on gpu; choose model.attention_kernel=xla"):
        attention.check_platform("splash", "gpu")
    with pytest.raises(UnsupportedAttention, match="model.attention_dropout_rate=0.1"):
        splash_attention(*qkv(), masking(), dropout_rate=0.1, rng=jax.random.key(0))


# Tiles splash visits at T = S = 512 in 128-token tiles (4 x 4), counted by hand.
@pytest.mark.parametrize("flags,tiles", [
    ({}, 16),
    ({"causal": True}, 10),  # the diagonal and below
    ({"window": 128}, 10),  # |i - j| <= 1: tiles two apart are 129 tokens apart at the closest
    ({"window": 129}, 14),  # ... which a window of 129 reaches
    ({"window": 64, "causal": True}, 7),  # the diagonal and the one below it
    # BigBird in 64-token blocks, one block each side: tiles |i - j| <= 1, plus tile row and
    # column 0 (the first 64 tokens are global)
    ({"pattern": Pattern(block=64, window_blocks=1, global_blocks=1)}, 14),
    # 128-token blocks and one random block: block 1 draws block 3, block 3 block 1 (the only
    # ones outside its window and the global block), block 2 has none left: every tile
    ({"pattern": Pattern(block=128, window_blocks=1, global_blocks=1,
                                   random_blocks=1)}, 16),
], ids=["full", "causal", "window-128", "window-129", "causal-window", "bigbird", "bigbird-random"])
def test_splash_visits_the_tiles_its_pattern_leaves_non_empty(flags, tiles):
    assert splash_blocks(512, 512, 128, **flags) == tiles


def test_splash_flops_count_each_layers_visited_tiles():
    """A 3-layer stack, 2 heads of 16, 4 rows of 512: window 128 with every 2nd layer global
    visits 16 + 10 + 16 tiles; each 9 matmuls training (2 forward) of 2 * 128^2 * 16 FLOPs per
    head and row."""
    cfg = _cfg(num_layers=3, num_heads=2, head_dim=16, attention_window=128,
               attention_global_every=2)
    per_tile = 2 * 128 * 128 * 16 * 2 * 4
    assert splash_flops(cfg, 4, 512) == 42 * 9 * per_tile
    assert splash_flops(cfg, 4, 512, training=False) == 42 * 2 * per_tile
    # full attention: every tile of every layer, 18 B N T^2 K, not dense attention's 12
    full = _cfg(num_layers=3, num_heads=2, head_dim=16)
    assert splash_flops(full, 4, 512) == 3 * 18 * 4 * 2 * 512 ** 2 * 16


def test_block_size_fields_and_each_generations_default():
    """model.attention_block_size sets every BlockSizes field, each field overrides it, each at
    most the length; left at 0 the TPU generation's block (v5p 1,024; v5e, v6e 512; v2 128; a
    CPU 128), halved until it divides the length."""
    sizes = lambda cfg, length, kind=None: {f: b for f, (_, b) in  # noqa: E731
                                            block_sizes(cfg, length, kind).items()}
    assert set(sizes(_cfg(attention_block_size=256), 1024).values()) == {256}
    mixed = block_sizes(_cfg(attention_block_size=256, attention_block_q_dkv=512), 1024)
    assert mixed["block_q_dkv"] == ("attention_block_q_dkv", 512)
    assert mixed["block_q"] == ("attention_block_size", 256)
    assert set(sizes(_cfg(attention_block_size=1024), 512).values()) == {512}
    for kind, block in [("TPU v5", 1024), ("TPU v5p", 1024), ("TPU v5 lite", 512),
                        ("TPU v6 lite", 512), ("TPU v2", 128), ("cpu", 128), (None, 128)]:
        assert set(sizes(_cfg(), 32768, kind).values()) == {block}, kind
    assert set(sizes(_cfg(), 1536, "TPU v5").values()) == {512}  # 1,024 does not divide 1,536
    assert set(sizes(_cfg(), 384, "TPU v5").values()) == {384}


def test_a_compute_sub_tile_must_divide_its_tile():
    with pytest.raises(UnsupportedAttention) as e:
        attention.check(_cfg(attention_kernel="splash", attention_dropout_rate=0.0,
                             attention_block_kv=512, attention_block_kv_compute=384),
                        [1024], training=False)
    assert ("min(model.attention_block_kv_compute=384, 1024), which must be a multiple of 128 "
            "that divides 1024 and 512 (model.attention_block_kv)") in str(e.value)
    attention.check(_cfg(attention_kernel="splash", attention_dropout_rate=0.0,
                         attention_block_kv=512, attention_block_kv_compute=256), [1024],
                    training=False)


@pytest.mark.parametrize("length,block", [(2048, 128), (16384, 128)])  # int8, int16 indices
def test_mask_info_bytes_are_splashs_own(length, block):
    """The SMEM the refusal counts is what splash's own mask processing makes for a full mask."""
    mask = splash.MultiHeadMask([splash.FullMask((length, length))] * 2)
    for fn, dkv in ((mask_info.process_mask, False), (mask_info.process_mask_dkv, True)):
        info, _ = fn(mask, (block, block))
        made = sum(x.nbytes for x in (info.data_next, info.mask_next, info.block_mask)
                   if x is not None)
        assert mask_info_bytes(length // block, length // block, dkv=dkv) == made


def test_splash_mask_info_past_a_cores_scalar_memory_is_refused_in_one_line():
    """At 131,072 tokens in 128-token tiles a global layer's grid of 1,024^2 tiles needs 3 MiB
    of mask info, over a core's 1 MiB of SMEM: one line naming the key and what to set; 256-token
    tiles (512^2 x 3 bytes) fit, and local layers alone shrink the grid."""
    modern = _cfg(attention_window=64, attention_global_every=3, num_layers=3)
    says = smem_error(dataclasses.replace(modern, attention_block_size=128), 131072, "TPU v5 lite")
    assert says == ("model.attention_kernel=splash at 131,072 tokens in 128 x 128-token tiles: "
                    "its forward kernel's mask info (3,145,728 bytes) exceeds a TPU core's "
                    "1,048,576-byte scalar memory (SMEM); set model.attention_block_size=256 "
                    "(larger tiles, fewer of them) or a shorter data.max_seq_length")
    assert smem_error(dataclasses.replace(modern, attention_block_size=256), 131072) is None
    assert smem_error(modern, 131072, "TPU v5 lite") is None  # the generation's 512
    assert smem_error(_cfg(attention_window=64, attention_block_size=128), 131072) is None
    with pytest.raises(UnsupportedAttention, match="exceeds a TPU core's"):
        kernels.get("splash").check_device(
            dataclasses.replace(modern, attention_block_size=128), 131072, "TPU v5")


@pytest.mark.parametrize("flags", [{}, {"causal": True}, {"window": 100}, {"window": 300},
                                   {"window": 100, "causal": True}])
def test_band_tiles_by_arithmetic_match_the_masks_tiles(flags):
    """Rectangular tiles (256 queries x 128 keys) of the band masks, counted by arithmetic,
    against the static mask's own tiles."""
    m = Masking(None, None, None, None, causal=flags.get("causal", False),
                window=flags.get("window"))
    dense = np.asarray(_splash_mask(m, 1024, 1024, 0)[:, :])
    want = int(dense.reshape(4, 256, 8, 128).any(axis=(1, 3)).sum())
    assert splash_blocks(1024, 1024, 256, block_kv=128, **flags) == want


def test_splash_flops_follow_each_kernels_tiles():
    """The forward kernel's tiles (2 matmuls), the dkv kernel's (4) and the dq kernel's (3)
    each counted in their own block sizes: full attention over 512 tokens in 128 x 256 forward
    tiles, 512 x 512 dkv tiles, 256 x 128 dq tiles is still 18 B N T^2 K."""
    cfg = _cfg(num_layers=1, num_heads=2, head_dim=16, attention_block_q=128,
               attention_block_kv=256, attention_block_q_dkv=512, attention_block_kv_dkv=512,
               attention_block_q_dq=256, attention_block_kv_dq=128)
    assert splash_flops(cfg, 1, 512) == 18 * 2 * 512 ** 2 * 16
    # a window of 64: query tiles 0 and 3 reach one 256-key tile, tiles 1 and 2 both: 6 of 8
    windowed = dataclasses.replace(cfg, attention_window=64)
    forward = 6 * 2 * 2 * 128 * 256 * 16 * 2
    assert splash_flops(windowed, 1, 512, training=False) == forward
