"""The modern encoder's switches (models/config.py): rope, gated FFN, RMSNorm, bias-free layers,
the embedding and first-layer norms, ModernBERT's task heads and sizes. Equality with
Hugging Face's ModernBERT classes is tested through convert/export
(tests/unit/interop/test_modernbert_hf.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import models
from bert_jax.models import layers
from bert_jax.models.bert import mean_pool
from bert_jax.models.masking import Masking

MODERN_TINY = dict(vocab_size=101, vocab_multiple=8, emb_dim=32, num_layers=4, num_heads=2,
                   head_dim=16, mlp_dim=48, attention_window=3)


def modern(name="bert", **kw):
    return models.model_section(name, {**models.modernbert_model_fields("tiny"), **MODERN_TINY}, **kw)


# The models run under nnx.jit: one program per input shape, ~3x cheaper to compile than eager
# mode's one per operation (the properties checked hold for any execution).
run = nnx.jit(lambda model, ids, mask=None, segments=None, positions=None: model(
    ids, attention_mask=mask, segment_ids=segments, positions=positions))


def ids_and_mask(B=2, T=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 101, (B, T))
    mask = np.ones((B, T), np.int32)
    mask[1, 11:] = 0
    return jnp.asarray(ids * mask), jnp.asarray(mask)


# The released encoders' counts: transformers' ModernBertModel built from answerdotai/
# ModernBERT-{base,large}'s config.json (sum of p.numel(); its layer 0 has no attn_norm).
@pytest.mark.parametrize("size,published", [("base", 149_014_272), ("large", 394_781_696)])
def test_modernbert_sizes_have_the_published_parameter_counts(size, published):
    model = models.abstract_model(models.model_section("bert", models.modernbert_model_fields(size)))
    assert models.param_counts(model)["total"] == published


def test_vocab_rows_are_padded_to_the_multiple():
    _, cfg = models.split_model_config(modern())
    assert (cfg.vocab_size, cfg.vocab_rows) == (101, 104)
    model = models.abstract_model(modern("bert_pretraining"))  # shapes only: traced
    assert model.bert.embeddings.word.embedding.shape == (104, 32)
    ids, mask = ids_and_mask()
    out = nnx.eval_shape(lambda m: m(ids, attention_mask=mask), model)
    assert out["mlm_logits"].shape == (2, 16, 104)


def test_rope_scores_depend_only_on_the_offset():
    """q.k after rope at positions (t, s) equals the unrotated-by-offset form at (t + c, s + c)."""
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32) for _ in range(2))
    def score(t, s, theta=100.0):
        rq, rk = layers.rope(q, jnp.array([[t]]), theta), layers.rope(k, jnp.array([[s]]), theta)
        return float(jnp.sum(rq * rk))
    for c in (1, 7, 300):
        assert score(3 + c, 5 + c) == pytest.approx(score(3, 5), rel=1e-4, abs=1e-5)
    assert score(0, 0) == pytest.approx(float(jnp.sum(q * k)), rel=1e-6)
    assert abs(score(3, 5) - score(3, 9)) > 1e-3  # the offset matters
    assert abs(score(3, 9, 100.0) - score(3, 9, 1e6)) > 1e-4  # so does the base


def test_rope_rotates_half_pairs_as_hugging_face():
    """Dimension i pairs with i + K/2 (rotate_half), angle position / theta^(2i/K)."""
    x = jnp.arange(1.0, 9.0).reshape(1, 1, 1, 8)
    out = np.asarray(layers.rope(x, jnp.array([[2]]), 10.0))[0, 0, 0]
    for i in range(4):
        a = 2 / 10.0 ** (2 * i / 8)
        x1, x2 = float(x[0, 0, 0, i]), float(x[0, 0, 0, i + 4])
        assert out[i] == pytest.approx(x1 * np.cos(a) - x2 * np.sin(a), rel=1e-5)
        assert out[i + 4] == pytest.approx(x2 * np.cos(a) + x1 * np.sin(a), rel=1e-5)


@pytest.mark.parametrize("length", [16, 24])
def test_scan_and_unrolled_layers_agree(length):
    """Under scan the rope base and the window pick by the layer, and the first layer skips
    its attention norm, as in the unrolled stack: the 4 layers scan as one step of a global
    layer and two local ones (the pattern's period), the fourth unrolled after it; at 24
    tokens the window of 3 runs banded in the local layers (models/kernels/xla.py)."""
    from bert_jax.models.kernels import xla

    ids, mask = ids_and_mask(T=length)
    outs = []
    for scan in (False, True):
        model = models.create_model(modern(scan_layers=scan, rope_theta=1000.0, rope_local_theta=10.0))
        outs.append(run(model, ids, mask)["sequence_output"])
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-5)
    window = xla.band_block(Masking(mask, mask, mask, mask, window=3), length, length)
    assert window == (3 if length == 24 else None)


def test_the_first_layer_reads_the_normalised_embeddings():
    """As ModernBERT's skip_first_prenorm (its layer 0's attn_norm is nn.Identity): the stack
    holds no attention norm for layer 0, the first row is layer 1's and is read (scanned and
    unrolled stacks agree: test_scan_and_unrolled_layers_agree)."""
    model = models.create_model(modern(num_layers=3))
    assert model.encoder.layers.attention_norm.scale.shape == (2, 32)
    assert model.encoder.layers.mlp_norm.scale.shape == (3, 32)
    ids, mask = ids_and_mask()
    before = run(model, ids, mask)["sequence_output"]
    scale = model.encoder.layers.attention_norm.scale
    scale[...] = scale[...].at[0].set(5.0)  # layer 1's
    assert not np.allclose(run(model, ids, mask)["sequence_output"], before, atol=1e-3)
    one = models.create_model(modern(num_layers=1, scan_layers=True))  # no attention norm at all
    assert one.encoder.layers.attention_norm is None
    assert np.isfinite(run(one, ids, mask)["sequence_output"]).all()


def test_switches_shape_the_parameters():
    model = models.create_model(modern())
    layer = model.encoder.layers
    assert layer.attention.query.bias is None and layer.mlp.wi.bias is None  # use_bias=False
    assert layer.mlp.wi_gate is not None  # glu
    assert layer.mlp_norm.bias is None  # norm_bias=False
    assert model.embeddings.position is None and model.embeddings.token_type is None
    assert model.encoder.final_norm is not None  # pre-norm: a final norm
    rms = models.create_model(modern(normalization="rmsnorm", embedding_norm=False,
                                     mlp_layer="mlp", activation="silu"))
    assert type(rms.encoder.final_norm).__name__ == "RMSNorm"
    assert rms.embeddings.norm is None and rms.encoder.layers.mlp.wi_gate is None
    ids, mask = ids_and_mask()
    assert np.isfinite(run(rms, ids, mask)["sequence_output"]).all()


def test_rope_positions_restart_in_packed_rows():
    """Two sequences packed in a row give what each gives alone (rope reads the positions)."""
    model = models.create_model(modern(attention_window=0, attention_global_every=0))
    a, b = jnp.arange(5, 12)[None], jnp.arange(20, 25)[None]
    alone = [run(model, x)["sequence_output"][0] for x in (a, b)]
    row = jnp.concatenate([a, b], 1)
    seg = jnp.array([[1] * 7 + [2] * 5])
    pos = jnp.array([list(range(7)) + list(range(5))])
    packed = run(model, row, segments=seg, positions=pos)["sequence_output"][0]
    np.testing.assert_allclose(packed[:7], alone[0], atol=2e-5)
    np.testing.assert_allclose(packed[7:], alone[1], atol=2e-5)


def test_mean_pooling_of_packed_examples_equals_unpacked():
    rng = np.random.default_rng(1)
    seq = jnp.asarray(rng.normal(size=(2, 6, 3)), jnp.float32)
    seg = jnp.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    got = mean_pool(seq, seg, jnp.array([0, 2, 6]))  # flat [CLS] indices of three examples
    want = [seq[0, :2].mean(0), seq[0, 2:5].mean(0), seq[1, :4].mean(0)]
    np.testing.assert_allclose(got, np.stack(want), atol=1e-6)
    np.testing.assert_allclose(mean_pool(seq, seg, None)[1], seq[1, :4].mean(0), atol=1e-6)


@pytest.mark.parametrize("name", ["bert_classification", "bert_tagging", "bert_span", "bert_choice"])
def test_modernbert_task_heads_run_and_train(name):
    model_cfg = modern(name, pooling="mean") if name in ("bert_classification", "bert_choice") \
        else modern(name)
    model = models.create_model(model_cfg)
    assert model.head is not None and model.bert.pooler is None
    ids, mask = ids_and_mask()
    if name == "bert_choice":
        ids, mask = jnp.stack([ids, ids[::-1]], 1), jnp.stack([mask, mask[::-1]], 1)
    out = run(model, ids, mask)
    assert all(np.isfinite(v).all() for v in out.values())


@pytest.mark.parametrize("changes,message", [
    (dict(rope_theta=0.0), "model.rope_theta=0.0"),
    (dict(rope_local_theta=-1.0), "model.rope_local_theta=-1.0"),
    (dict(normalization="rmsnorm", norm_bias=True), "model.norm_bias=False"),
    (dict(task_head="bert", pooling="mean"), "model.pooling=mean"),
    (dict(mlp_layer="swiglu"), "model.mlp_layer='swiglu'"),
    (dict(positions="alibi"), "model.positions='alibi'"),
])
def test_bad_switches_are_errors_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        models.split_model_config({**modern("bert_classification"), **changes})


def test_glu_counts_three_ffn_matrices():
    plain = models.flops_per_token(modern(mlp_layer="mlp"), 16)["encoder_per_token"]
    glu = models.flops_per_token(modern(), 16)["encoder_per_token"]
    assert glu - plain == pytest.approx(4 * 2 * 32 * 48)  # one more D x F matmul per layer


def test_a_context_extension_phase_changes_the_rope_base(cli, tmp_path, caplog):
    """data.phases' 5th entry is the phase's global rope base: the phase's config and graph
    have it, and a run goes through both phases (train and eval compiled per phase)."""
    from bert_jax import config as config_lib
    from bert_jax.models.attention import Attention
    from bert_jax.training import state

    phases = "((0,32,10,0,1000.0),(4,64,20))"
    config = config_lib.load("configs/modernbert.py:tiny", [f"data.phases={phases}"])
    first, later = config_lib.phase_config(config, 0)[1], config_lib.phase_config(config, 4)[1]
    assert (first.model.rope_theta, later.model.rope_theta) == (1000.0, 160_000.0)
    graphs = [state.graphdef_of(c) for c in (first, later)]
    thetas = [{n.rope_thetas for _, n in nnx.graph.iter_graph(nnx.merge(g, nnx.state(
        models.abstract_model(config_lib.model_config(c))))) if isinstance(n, Attention)} for g, c in
        zip(graphs, (first, later))]
    assert thetas == [{(1000.0, 10_000.0)}, {(160_000.0, 10_000.0)}]
    code, _, err = cli(["train", "--config", "configs/modernbert.py:tiny", "--workdir",
                        str(tmp_path / "w"), "--config.data.name=synthetic", "--config.train.steps=6",
                        f"--config.data.phases={phases}", "--config.train.eval_every=3",
                        "--config.train.eval_steps=1", "--config.train.batch_size=8",
                        "--config.model.attention_window=8", "--config.schedule.warmup_steps=2",
                        "--config.data.instances=full_rows",
                        # the phases are the point, not the size: a small vocab and width (the
                        # tiny model's 50k-row table is most of what a step and a save cost)
                        "--config.model.vocab_size=128", "--config.model.emb_dim=32",
                        "--config.model.head_dim=16", "--config.model.mlp_dim=48"])
    assert code == 0, err
    assert "phase 1 from step 4" in caplog.text


@pytest.mark.parametrize("phases,message", [
    ("((0,32,10,0,-5.0),)", "rope base -5.0 must be > 0"),
    ("((0,32,10,0,1.0,7),)", "each phase is (first step"),
])
def test_bad_context_extension_phases(phases, message):
    from bert_jax import config as config_lib
    config = config_lib.load("configs/modernbert.py:tiny", [f"data.phases={phases}"])
    with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
        config_lib.check_phase_batches(config, 1, 1)
    bert = config_lib.load("configs/bert_pretrain.py:tiny", ["data.phases=((0,32,10,0,1000.0),)"])
    with pytest.raises(config_lib.ConfigError, match="without rope"):
        config_lib.check_phase_batches(bert, 1, 1)


# ModernBERT's pretraining dropouts (AnswerDotAI/ModernBERT, pretraining_documentation,
# yamls/modernbert/modernbert-{base,large}-pretrain.yaml): attn_out_dropout_prob 0.1 (the
# attention's `out_drop(self.Wo(attn))`, src/bert_layers/attention.py, before the residual add
# of layers.py's pre-norm layer); attention_probs, mlp and embed dropout 0.0.
PUBLISHED_DROPOUT = {"attention_output_dropout_rate": 0.1, "attention_dropout_rate": 0.0,
                     "dropout_rate": 0.0}


def test_modernbert_dropouts_are_the_published_ones():
    for size in ("base", "large"):
        fields = models.modernbert_model_fields(size)
        assert {k: fields[k] for k in PUBLISHED_DROPOUT} == PUBLISHED_DROPOUT


def block_and_inputs(**changes):
    """One pre-norm layer (not the first: it reads its attention norm) whose FFN adds nothing
    (its output projection zero): the layer's output is x + dropout(attention output)."""
    from bert_jax.models.masking import Masking
    from bert_jax.models.transformer import Block

    _, cfg = models.split_model_config(modern(**{"attention_window": 0, "attention_global_every": 0,
                                                 **PUBLISHED_DROPOUT, **changes}))
    with nnx.use_eager_sharding(False):  # (as models.create_model)
        block = Block(cfg, cross_attention=False, rngs=nnx.Rngs(params=0))
    block.mlp.wo.kernel[...] = jnp.zeros_like(block.mlp.wo.kernel[...])
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16, 32)), jnp.float32)
    seg, pos = jnp.ones((2, 16), jnp.int32), jnp.broadcast_to(jnp.arange(16), (2, 16))
    return block, x, Masking(seg, seg, pos, pos)


def test_attention_output_dropout_drops_the_output_projection_elementwise():
    """With only the attention output rate > 0: in training the layer adds the attention
    output with each element dropped (0) or scaled by 1 / (1 - 0.1), as torch's nn.Dropout
    after Wo; in evaluation (no rng) nothing is dropped."""
    block, x, masking = block_and_inputs()
    layer = nnx.jit(lambda b, x, rng=None: b(x, masking, rng=rng, layer=1)[0])
    attention = nnx.jit(lambda b, x: b.attention(b.attention_norm(x), b.attention_norm(x), masking)[0])
    added = attention(block, x)
    np.testing.assert_allclose(layer(block, x) - x, added, atol=1e-6)
    ratio = np.asarray((layer(block, x, jax.random.key(3)) - x) / added)
    kept = np.isclose(ratio, 1 / 0.9, atol=1e-3)
    assert (kept | np.isclose(ratio, 0.0, atol=1e-6)).all()
    assert 0.05 < 1 - kept.mean() < 0.15  # about 10% dropped
    # The rate is the attention output's alone: at 0 nothing is dropped in training either.
    block, x, masking = block_and_inputs(attention_output_dropout_rate=0.0)
    np.testing.assert_array_equal(layer(block, x, jax.random.key(3)), layer(block, x))


def test_bert_attention_output_dropout_is_dropout_rate_by_default():
    """BERT drops the attention output with its hidden dropout (HF BertSelfOutput's
    hidden_dropout_prob): the default (-1) is model.dropout_rate, bit for bit."""
    fields = {**models.bert_model_fields("tiny"), "vocab_size": 101, "num_layers": 1}
    assert fields["attention_output_dropout_rate"] == -1
    ids, mask = ids_and_mask()
    train = nnx.jit(lambda m: m(ids, attention_mask=mask, rng=jax.random.key(0))["sequence_output"])
    outs = {rate: train(models.create_model(models.model_section("bert", fields,
                                                                 attention_output_dropout_rate=rate)))
            for rate in (-1.0, 0.1, 0.0)}
    np.testing.assert_array_equal(outs[-1.0], outs[0.1])
    assert not np.allclose(outs[-1.0], outs[0.0], atol=1e-3)
