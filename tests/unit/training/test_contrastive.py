"""The contrastive objectives (training/contrastive.py): equal to sentence-transformers' losses
on the same embeddings; on 8 devices equal to one device holding the whole batch; GradCache's
loss and gradient equal to the whole batch's."""

import functools
import re

import jax
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from helpers import REPO
from jax.sharding import NamedSharding, PartitionSpec
from sentence_transformers.sentence_transformer import losses as st_losses

from bert_jax import config as config_lib
from bert_jax.training import contrastive, objectives, sharding, train
from bert_jax.training import state as state_lib

RNG = np.random.default_rng(0)
# The losses under jax.jit, as the train step runs them: one program per call's shapes, where
# eagerly each of their operations is a compile of its own (the properties hold either way).
info_nce = jax.jit(contrastive.info_nce, static_argnames="symmetric")
cosent = jax.jit(contrastive.cosent)


def _embeddings(B=6, N=3, D=16):
    return RNG.normal(size=(B, D)).astype(np.float32), RNG.normal(size=(B, N, D)).astype(np.float32)


def _st(loss, *arrays, labels=None):
    return float(loss.compute_loss_from_embeddings([torch.tensor(a) for a in arrays], labels))


def test_info_nce_equals_multiple_negatives_ranking_loss():
    q, d = _embeddings()
    w = np.ones(len(q), np.float32)
    cols = [d[:, j] for j in range(d.shape[1])]  # (anchor, positive, negative_1, negative_2)
    ours, _ = info_nce(q, d, w, 20.0, symmetric=False)
    np.testing.assert_allclose(ours / len(q), _st(st_losses.MultipleNegativesRankingLoss(None), q, *cols),
                               rtol=1e-5)
    sym, _ = info_nce(q, d[:, :1], w, 7.0, symmetric=True)
    st_sym = st_losses.MultipleNegativesRankingLoss(None, scale=7.0, partition_mode="per_direction",
                                                    directions=("query_to_doc", "doc_to_query"))
    np.testing.assert_allclose(sym / len(q), _st(st_sym, q, d[:, 0]), rtol=1e-5)


def test_padding_examples_neither_count_nor_compete():
    q, d = _embeddings()
    w = np.array([1, 1, 1, 1, 0, 0], np.float32)
    padded, ok = info_nce(q, d, w, 20.0, symmetric=True)
    alone, ok_alone = info_nce(q[:4], d[:4], w[:4], 20.0, symmetric=True)
    np.testing.assert_allclose(padded, alone, rtol=1e-6)
    assert ok == ok_alone
    score = RNG.uniform(0, 5, len(q)).astype(np.float32)
    np.testing.assert_allclose(cosent(q, d[:, 0], score, w, 20.0),
                               cosent(q[:4], d[:4, 0], score[:4], w[:4], 20.0), rtol=1e-6)


def test_a_document_equal_to_a_querys_positive_is_not_its_negative():
    """Queries 0 and 1 share their positive (as SQuAD's questions share paragraphs): neither
    counts the other's copy as a negative; the symmetric direction neither counts the other query."""
    q, d = _embeddings(B=4, N=2)
    d[1, 0] = d[0, 0]
    ids = RNG.integers(4, 64, (4, 3, 6))
    ids[1, 1] = ids[0, 1]  # [query, positive, negative] token ids
    keys = {"query_keys": contrastive.text_keys(ids[:, 0]),
            "document_keys": contrastive.text_keys(ids[:, 1:])}
    w = np.ones(4, np.float32)
    logits = np.array(20.0 * contrastive._unit(q) @ contrastive._unit(d.reshape(8, -1)).T)
    logits[0, 2] = logits[1, 0] = -np.inf  # the copies of each one's positive
    expected = sum(-(logits[i, 2 * i] - np.logaddexp.reduce(logits[i])) for i in range(4))
    got, ok = info_nce(q, d, w, 20.0, False, **keys)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    plain, _ = info_nce(q, d, w, 20.0, False)
    assert plain > got  # without the keys the copy competes
    back = np.array(20.0 * contrastive._unit(d[:, 0]) @ contrastive._unit(q).T)
    back[0, 1] = back[1, 0] = -np.inf
    backward = sum(-(back[i, i] - np.logaddexp.reduce(back[i])) for i in range(4))
    sym, _ = info_nce(q, d, w, 20.0, True, **keys)
    np.testing.assert_allclose(sym, (expected + backward) / 2, rtol=1e-5)


def test_another_positive_of_the_same_query_is_not_its_negative():
    """Rows 2 and 3 are one query with two relevant documents (a BEIR qrels' query): neither
    row counts the other's positive as a negative; their hard negatives still compete."""
    q, d = _embeddings(B=4, N=2)
    q[3] = q[2]
    ids = RNG.integers(4, 64, (4, 3, 6))
    ids[3, 0] = ids[2, 0]  # the same query text
    keys = {"query_keys": contrastive.text_keys(ids[:, 0]),
            "document_keys": contrastive.text_keys(ids[:, 1:])}
    w = np.ones(4, np.float32)
    logits = np.array(20.0 * contrastive._unit(q) @ contrastive._unit(d.reshape(8, -1)).T)
    logits[2, 6] = logits[3, 4] = -np.inf  # the other row's positive (its negative, 7 and 5, stays)
    expected = sum(-(logits[i, 2 * i] - np.logaddexp.reduce(logits[i])) for i in range(4))
    got, _ = info_nce(q, d, w, 20.0, False, **keys)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    plain, _ = info_nce(q, d, w, 20.0, False)
    assert plain > got


def test_cosent_and_matryoshka_equal_sentence_transformers():
    q, d = _embeddings(B=8, N=1)
    score = RNG.uniform(0, 5, len(q)).astype(np.float32)
    ours = cosent(q, d[:, 0], score, np.ones(8, np.float32), 20.0)
    np.testing.assert_allclose(ours, _st(st_losses.CoSENTLoss(None), q, d[:, 0],
                                         labels=torch.tensor(score)), rtol=1e-5)
    # MatryoshkaLoss (weights 1): the inner loss on the first `dim` dimensions, summed; the
    # similarity renormalises the truncated vectors.
    cfg = {"name": "bert_embedding", "emb_dim": 16, "matryoshka_dims": (16, 8, 4)}
    objective = objectives.for_model(cfg)
    batch = {"query_input_ids": np.arange(32, dtype=np.int32).reshape(8, 4)}  # 8 distinct queries
    terms, metrics = objective.loss({"query": q, "document": d, "scale": np.full(8, 20.0)}, batch)
    mnrl = st_losses.MultipleNegativesRankingLoss(None)
    expected = sum(_st(mnrl, q[:, :k], d[:, 0, :k]) for k in (16, 8, 4))
    np.testing.assert_allclose(terms["contrastive"] / 8, expected, rtol=1e-5)
    assert {"contrastive_accuracy", "contrastive_accuracy@8", "contrastive_accuracy@4"} <= set(metrics)


def _config(objective="contrastive", *overrides):
    return config_lib.load(f"{REPO}/configs/embeddings.py:{objective},tiny", [
        "model.vocab_size=64", "model.emb_dim=32", "model.num_heads=2", "model.head_dim=16",
        "model.mlp_dim=64", "model.num_layers=1", "model.dropout_rate=0.0",
        "model.attention_dropout_rate=0.0", "train.batch_size=32", "data.max_seq_length=8",
        *overrides])


def _batch(config, N):
    B, T = config.train.batch_size, config.data.max_seq_length
    lengths = RNG.integers(2, T + 1, (B, 1 + N))
    mask = (np.arange(T) < lengths[..., None]).astype(np.int32)
    ids = RNG.integers(4, 64, (B, 1 + N, T)).astype(np.int32) * mask
    batch = {"query_input_ids": ids[:, 0], "query_attention_mask": mask[:, 0],
             "document_input_ids": ids[:, 1:], "document_attention_mask": mask[:, 1:]}
    batch |= {k.replace("input_ids", "token_type_ids"): np.zeros_like(v)
              for k, v in batch.items() if k.endswith("input_ids")}
    if "score" in objectives.for_config(config).batch_spec(config):
        batch["score"] = RNG.uniform(0, 5, B).astype(np.float32)
    return batch


def _whole_batch_on_one_device(config, params, batch):
    """Loss and gradient of the batch as one array on one device (no mesh)."""
    graphdef = state_lib.abstract_state(config, sharding.make_mesh(config.mesh), None)[0]
    objective = objectives.for_config(config)
    one = jax.devices()[0]
    params, batch = jax.device_put((params, batch), one)
    weights = objective.weights(batch)

    def loss(p):
        terms, _ = objective(nnx.merge(graphdef, p), batch, None)
        return sum(terms[k] / weights[k] for k in terms)

    return jax.jit(jax.value_and_grad(loss))(params)


# Two cases, each a train step of its own to compile: the InfoNCE pool (contrastive_symmetric
# runs contrastive's query -> documents term, in-batch and hard negatives, plus the positive ->
# queries term; the one-device tests above pin each direction), and CoSENT's pairs.
@pytest.mark.parametrize("objective,overrides,N", [
    ("contrastive_symmetric", ("data.num_negatives=2", "model.learn_scale=True"), 3),
    ("cosent", ("model.matryoshka_dims=(32, 8)",), 1),
])
def test_eight_devices_and_gradcache_equal_one_device_holding_the_batch(objective, overrides, N):
    config = _config(objective, *overrides)
    batch = _batch(config, N)
    mesh = sharding.make_mesh(config.mesh)
    assert mesh.shape["data"] == 8
    tx = optax.sgd(1.0)  # new params = params - gradient
    graphdef, _, state_sh = state_lib.abstract_state(config, mesh, tx)
    out = {}
    for accum in (1, 4):
        config.train.grad_accum_steps = accum
        step = jax.jit(functools.partial(
            train.train_step, graphdef=graphdef, objective=objectives.for_config(config), tx=tx,
            schedule=optax.constant_schedule(1.0), accum=accum, dropout_key=jax.random.key(0),
            mesh=mesh))
        with jax.set_mesh(mesh):
            state = state_lib.init_state(config, tx, state_sh)
            params = jax.device_get(state["params"])
            global_batch = {k: jax.device_put(v, NamedSharding(mesh, PartitionSpec(config_lib.BATCH_AXES)))
                            for k, v in batch.items()}
            new, metrics = step(state, global_batch)
        out[accum] = jax.device_get((new["params"], metrics))
    loss, grads = jax.device_get(_whole_batch_on_one_device(config, params, batch))
    expected = jax.tree.map(lambda p, g: p - g, params, grads)
    for accum, (new_params, metrics) in out.items():
        np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-5, err_msg=f"accum={accum}")
        # float32 sums in another order: CoSENT's scale 20 inside exp leaves differences of a
        # few 1e-6 in single gradient entries (a pool of the wrong rows is off everywhere)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5),
                     new_params, expected)
    assert float(loss) > 0 and np.isfinite(float(loss))
    if "model.learn_scale=True" in overrides:  # the scale is learned: it has a gradient
        assert abs(float(grads["log_scale"])) > 0


@pytest.mark.parametrize("objective,overrides,says", [
    ("contrastive", ("train.batch_size=1",), "train.batch_size=1: train.objective='contrastive' takes "
     "a query's negatives from the other pairs of its batch"),
    ("cosent", ("train.batch_size=1",), "train.batch_size=1: train.objective='cosent' ranks the pairs"),
    ("cosent", ("data.num_negatives=1",), "data.num_negatives=1: train.objective='cosent' trains on "
     "scored pairs and reads no negatives"),
    ("contrastive", ("model.learn_scale=True", "model.similarity_scale=150"),
     "model.similarity_scale=150 is above the learned scale's cap 100"),
])
def test_a_config_the_loss_cannot_learn_from_is_refused_before_the_mesh(objective, overrides, says):
    """One pair a batch has no in-batch negative (loss 0) and nothing for CoSENT to rank; a
    learned scale starts at most at its cap (else the run trains with another value)."""
    with pytest.raises((config_lib.ConfigError, ValueError), match=re.escape(says)):
        config = _config(objective, *overrides)
        objectives.for_config(config).check(config)


def test_a_model_config_with_a_scale_above_the_cap_still_reads():
    """The cap is a training check: a run's stored model config from before it (a learned scale
    started at 150, clipped to 100 while training) reads, so its checkpoints evaluate."""
    spec = config_lib.resolve(_config("contrastive", "model.learn_scale=True",
                                      "model.similarity_scale=150"))
    assert spec.model.similarity_scale == 150 and spec.model.learn_scale


def test_a_batch_of_one_query_with_hard_negatives_is_allowed():
    config = _config("contrastive", "train.batch_size=1", "data.num_negatives=1")
    objectives.for_config(config).check(config)
