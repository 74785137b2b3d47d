"""Schedules against their papers' formulas (numbers written out here), masks, optimizers."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.training import optim


def sched(name: str, **kw) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(name=name, warmup_steps=kw.pop("warmup_steps", 0), **kw))


def run_config(name: str = "adamw", schedule: str = "constant", **opt) -> ml_collections.ConfigDict:
    optimizer = dict(name=name, learning_rate=0.1, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0,
                     grad_clip_norm=0.0)
    return ml_collections.ConfigDict(dict(
        optimizer={**optimizer, **opt}, schedule=dict(name=schedule, warmup_steps=0, final_fraction=0.0),
        train=dict(steps=100), model=dict(emb_dim=8)))


def params() -> dict:
    return {"bert": {"embeddings": {"word": {"embedding": jnp.full((4, 3), 2.0)},
                                    "norm": {"scale": jnp.ones(3), "bias": jnp.zeros(3)}},
                     "layer_0": {"attention": {"query": {"kernel": jnp.full((3, 3), -1.0),
                                                         "bias": jnp.full(3, 0.5)}}}},
            "mlm": {"bias": jnp.full(4, 0.25)}}


def values(schedule, steps) -> np.ndarray:
    return np.array([float(schedule(s)) for s in steps])


def test_rsqrt_paper_matches_eq3():
    # Vaswani et al. (3), d_model 512, warmup 4000, step_num = count + 1:
    # peak at step_num 4000 = 512^-0.5 * 4000^-0.5; at 16000 half of it; step 1 = 512^-0.5 * 4000^-1.5.
    s = optim.make_schedule(sched("rsqrt_paper", warmup_steps=4000), 1.0, 100_000, d_model=512)
    np.testing.assert_allclose(values(s, [3999, 15999, 0, 1999]),
                               [6.98771e-4, 3.49386e-4, 1.74693e-7, 3.49386e-4], rtol=1e-5)
    assert float(s(3999)) > float(s(3998)) and float(s(3999)) > float(s(4000))


def test_warmup_rsqrt_peaks_exactly_at_warmup():
    s = optim.make_schedule(sched("warmup_rsqrt", warmup_steps=100), 0.01, 1000)
    # n = count + 1: 0.01 * n / 100 up to n = 100, then 0.01 * sqrt(100 / n).
    np.testing.assert_allclose(values(s, [0, 49, 99, 399, 9999]), [1e-4, 5e-3, 1e-2, 5e-3, 1e-3],
                               rtol=1e-6)


def test_warmup_linear_is_berts_formula():
    # BERT paper: peak 1e-4, 10k warmup, 1M steps; lr(c) = 1e-4 * c / 1e4 while c < 1e4,
    # else 1e-4 * (1 - c / 1e6) (no rescaling after the warmup), c = updates already applied.
    s = optim.make_schedule(sched("warmup_linear", warmup_steps=10_000), 1e-4, 1_000_000)
    got = values(s, [0, 5_000, 9_999, 10_000, 500_000, 1_000_000, 2_000_000])
    np.testing.assert_allclose(got, [0.0, 5e-5, 9.999e-5, 9.9e-5, 5e-5, 0.0, 0.0], rtol=1e-5, atol=1e-12)


def test_cosine_and_constant():
    s = optim.make_schedule(sched("cosine", warmup_steps=10, final_fraction=0.1), 1.0, 110)
    # Warmup c / 10, then 0.1 + 0.9 * (1 + cos(pi * (c - 10) / 100)) / 2.
    np.testing.assert_allclose(values(s, [0, 5, 10, 60, 110, 500]), [0.0, 0.5, 1.0, 0.55, 0.1, 0.1],
                               rtol=1e-6, atol=1e-7)
    flat = optim.make_schedule(sched("constant"), 0.3, 10)
    np.testing.assert_allclose(values(flat, [0, 7, 10_000]), 0.3, rtol=1e-6)
    warm = optim.make_schedule(sched("constant", warmup_steps=4), 0.3, 10)
    np.testing.assert_allclose(values(warm, [0, 2, 4, 50]), [0.0, 0.15, 0.3, 0.3], rtol=1e-6)


def test_schedule_is_jittable_and_used_from_update_one():
    """optax calls the schedule with count 0 for the first update (BERT's global_step 0)."""
    config = run_config("sgd", "warmup_linear", b1=0.0, learning_rate=1.0)
    config.schedule.warmup_steps = 4
    tx, schedule = optim.make_optimizer(config)
    p = {"w": jnp.zeros(())}
    state, step = tx.init(p), jax.jit(tx.update)
    for count in range(6):
        updates, state = step({"w": jnp.ones(())}, state, p)
        np.testing.assert_allclose(-float(updates["w"]), float(jax.jit(schedule)(count)), rtol=1e-6)


@pytest.mark.parametrize("cfg, total, d_model, key", [
    (sched("bogus"), 10, None, "schedule.name"),
    (sched("constant", warmup_steps=-1), 10, None, "schedule.warmup_steps"),
    (sched("constant", warmup_steps=2.5), 10, None, "schedule.warmup_steps"),
    (sched("warmup_linear", warmup_steps=11), 10, None, "schedule.warmup_steps"),
    (sched("cosine", warmup_steps=20), 10, None, "schedule.warmup_steps"),
    (sched("warmup_rsqrt"), 10, None, "schedule.warmup_steps"),
    (sched("rsqrt_paper", warmup_steps=4), 10, None, "d_model"),
    (sched("cosine", final_fraction=2.0), 10, None, "schedule.final_fraction"),
    (sched("warmup_linear"), 0, None, "train.steps"),
])
def test_bad_schedule_names_the_key(cfg, total, d_model, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as err:
        optim.make_schedule(cfg, 1.0, total, d_model)
    if key == "schedule.name":
        assert "'bogus'" in str(err.value) and all(n in str(err.value) for n in optim.SCHEDULES)


@pytest.mark.parametrize("opt, key", [
    (dict(name="adagrad"), "optimizer.name"),
    (dict(name="adam", weight_decay=0.01), "adamw"),
    (dict(name="adamw", weight_decay=-1.0), "optimizer.weight_decay"),
    (dict(grad_clip_norm=-1.0), "optimizer.grad_clip_norm"),
])
def test_bad_optimizer_names_the_key(opt, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        optim.make_optimizer(run_config(**opt))


def test_rsqrt_paper_takes_d_model_from_config():
    config = run_config(schedule="rsqrt_paper", learning_rate=2.0)
    config.schedule.warmup_steps = 4
    _, schedule = optim.make_optimizer(config)
    np.testing.assert_allclose(float(schedule(3)), 2.0 * 8**-0.5 * 4**-0.5, rtol=1e-6)


def test_decay_mask_only_kernels_and_embeddings():
    assert optim.decay_mask(params()) == {
        "bert": {"embeddings": {"word": {"embedding": True}, "norm": {"scale": False, "bias": False}},
                 "layer_0": {"attention": {"query": {"kernel": True, "bias": False}}}},
        "mlm": {"bias": False}}


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_weight_decay_skips_biases_and_layernorm(name):
    tx, _ = optim.make_optimizer(run_config(name, weight_decay=0.5))
    p = params()
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p)
    new = optax.apply_updates(p, updates)
    mask = optim.decay_mask(p)
    for m, old, upd in zip(jax.tree.leaves(mask), jax.tree.leaves(p), jax.tree.leaves(new)):
        assert bool(jnp.any(old != upd)) == m
    if name == "adamw":  # zero gradient: p - lr * wd * p
        np.testing.assert_allclose(new["mlm"]["bias"], 0.25)
        np.testing.assert_allclose(new["bert"]["layer_0"]["attention"]["query"]["kernel"], -0.95)


def test_gradient_clipping_caps_the_global_norm():
    grads = {"a": jnp.full((4,), 2.0), "b": {"c": jnp.full((9,), 1.0)}}  # global norm 5
    for clip, norm in [(1.0, 1.0), (0.0, 5.0), (10.0, 5.0)]:
        tx, _ = optim.make_optimizer(run_config("sgd", b1=0.0, learning_rate=1.0, grad_clip_norm=clip))
        updates, _ = tx.update(grads, tx.init(grads), grads)
        np.testing.assert_allclose(float(optax.tree.norm(updates)), norm, rtol=1e-6)


@pytest.mark.parametrize("name", optim.OPTIMIZERS)
@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_state_mirrors_params_for_tree_map_params(name, clip):
    config = run_config(name, schedule="warmup_linear", grad_clip_norm=clip,
                        weight_decay=0.01 if name in ("adamw", "lamb") else 0.0)
    config.schedule.warmup_steps = 10
    tx, _ = optim.make_optimizer(config)
    p = params()
    state = tx.init(p)
    assert optax.tree_map_params(tx, lambda x: x, state) is not None
    # How train.py derives the state's shardings: param-shaped subtrees from the params' tree.
    labels = jax.tree_util.tree_map_with_path(lambda path, _: jax.tree_util.keystr(path), p)
    mapped = optax.tree_map_params(tx, lambda _, label: label, state, labels,
                                   transform_non_params=lambda _: "other")
    leaves = jax.tree.leaves(mapped)
    assert set(jax.tree.leaves(labels)) <= set(leaves) and "other" in leaves
    dtypes = {x.dtype for x in jax.tree.leaves(state)}
    assert dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}  # int32: step counters
    # Clipping on or off gives the same state structure, so checkpoints restore either way.
    other, _ = optim.make_optimizer(run_config(name, schedule="warmup_linear", grad_clip_norm=1.0 - clip,
                                               weight_decay=config.optimizer.weight_decay))
    assert jax.tree.structure(other.init(p)) == jax.tree.structure(state)
