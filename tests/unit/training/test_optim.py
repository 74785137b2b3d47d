"""Schedules against their papers' formulas (numbers written out here), masks, optimizers."""

import math
import re
import shutil
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax.training import input as pipelines
from bert_jax.training import metrics, optim, train


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
    (dict(b2=1.5), "optimizer.b2=1.5 must be in \\[0, 1\\)"),
    (dict(b1=-0.1), "optimizer.b1"),
    (dict(eps=-1e-8), "optimizer.eps"),
    (dict(learning_rate="fast"), "optimizer.learning_rate='fast': expected a float"),
    (dict(momentum=0.9), "unknown config key optimizer.momentum"),
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


@pytest.mark.parametrize("name", ["adam_weight_decay", "adamw", "lamb"])
def test_weight_decay_skips_biases_and_layernorm(name):
    tx, _ = optim.make_optimizer(run_config(name, weight_decay=0.5))
    p = params()
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p)
    new = optax.apply_updates(p, updates)
    mask = optim.decay_mask(p)
    for m, old, upd in zip(jax.tree.leaves(mask), jax.tree.leaves(p), jax.tree.leaves(new)):
        assert bool(jnp.any(old != upd)) == m
    if name in ("adam_weight_decay", "adamw"):  # zero gradient: p - lr * wd * p
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
                        weight_decay=0.0 if name in ("adam", "sgd") else 0.01)
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


# A small BERT-shaped pytree: our leaf path -> the name Google's checkpoint gives that variable
# (its exclude_from_weight_decay regexes are matched against these names).
GOOGLE_NAMES = {
    ("bert", "embeddings", "word", "embedding"): "bert/embeddings/word_embeddings",
    ("bert", "embeddings", "norm", "scale"): "bert/embeddings/LayerNorm/gamma",
    ("bert", "embeddings", "norm", "bias"): "bert/embeddings/LayerNorm/beta",
    ("bert", "layer_0", "query", "kernel"): "bert/encoder/layer_0/attention/self/query/kernel",
    ("bert", "layer_0", "query", "bias"): "bert/encoder/layer_0/attention/self/query/bias",
    ("mlm", "bias"): "cls/predictions/output_bias",
}
SHAPES = {"bert/embeddings/word_embeddings": (6, 4), "bert/embeddings/LayerNorm/gamma": (4,),
          "bert/embeddings/LayerNorm/beta": (4,), "cls/predictions/output_bias": (6,),
          "bert/encoder/layer_0/attention/self/query/kernel": (4, 4),
          "bert/encoder/layer_0/attention/self/query/bias": (4,)}


def google_bert_steps(params: dict, grads: list, init_lr: float, num_train_steps: int,
                      num_warmup_steps: int, weight_decay_rate: float = 0.01, beta_1: float = 0.9,
                      beta_2: float = 0.999, epsilon: float = 1e-6) -> dict:
    """google-research/bert optimization.py (create_optimizer + AdamWeightDecayOptimizer) in
    numpy, float64: `grads` applied in order from global_step 0, variables named as Google's."""
    params = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    for global_step, grad in enumerate(grads):
        # polynomial_decay(init_lr, global_step, num_train_steps, end 0, power 1, no cycle).
        lr = init_lr * (1.0 - min(global_step, num_train_steps) / num_train_steps)
        if global_step < num_warmup_steps:
            lr = init_lr * global_step / num_warmup_steps
        # tf.clip_by_global_norm(grads, clip_norm=1.0).
        norm = np.sqrt(sum(np.sum(np.square(g)) for g in grad.values()))
        grad = {k: g * 1.0 / max(norm, 1.0) for k, g in grad.items()}
        for name, param in params.items():
            m[name] = beta_1 * m[name] + (1.0 - beta_1) * grad[name]
            v[name] = beta_2 * v[name] + (1.0 - beta_2) * np.square(grad[name])
            update = m[name] / (np.sqrt(v[name]) + epsilon)
            if not any(re.search(r, name) for r in ["LayerNorm", "layer_norm", "bias"]):
                update += weight_decay_rate * param
            params[name] = param - lr * update
    return params


def ours(flat: dict) -> dict:
    """Google-named arrays -> our nested params pytree."""
    tree: dict = {}
    for path, name in GOOGLE_NAMES.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(flat[name], jnp.float32)
    return tree


def five_steps(name: str) -> tuple[dict, dict]:
    """(our params after 5 steps of the paper config's optimizer `name`, Google's in numpy)."""
    # The paper's pretraining config (lr 1e-4 there; 1e-2 here so the steps are large against
    # the tolerance), a 2-step warmup of a 10-step run so the schedule's both parts are used.
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:base"), [
        "train.steps=10", "schedule.warmup_steps=2", "optimizer.learning_rate=0.01",
        f"optimizer.name={name}"])
    tx, _ = optim.make_optimizer(config)
    rng = np.random.default_rng(0)
    start = {k: rng.normal(size=s) for k, s in SHAPES.items()}
    # Global norms from ~0.3 to ~3: clipping is active on some steps and not on others.
    grads = [{k: scale * rng.normal(size=s) for k, s in SHAPES.items()}
             for scale in (0.5, 0.05, 0.4, 0.1, 0.3)]
    params = ours(start)
    state, update = tx.init(params), jax.jit(tx.update)
    for g in grads:
        updates, state = update(ours(g), state, params)
        params = optax.apply_updates(params, updates)
    google = ours(google_bert_steps(start, grads, 0.01, 10, 2, config.optimizer.weight_decay,
                                    config.optimizer.b1, config.optimizer.b2, config.optimizer.eps))
    return params, google


def test_paper_configs_use_googles_optimizer():
    for spec in ("bert_pretrain.py:base", "bert_pretrain.py:large", "glue.py:mrpc", "squad.py",
                 "ner.py", "swag.py"):
        opt = config_lib.load(str(REPO / "configs" / spec)).optimizer
        assert (opt.name, opt.b1, opt.b2, opt.eps, opt.weight_decay, opt.grad_clip_norm) == (
            "adam_weight_decay", 0.9, 0.999, 1e-6, 0.01, 1.0), spec
    # The CPU-sized runs from scratch at lr 1e-3 (not the paper's): bias-corrected AdamW.
    for spec in ("bert_pretrain.py:tiny", "glue.py:sst2,tiny", "ner.py:conll2003,mini", "swag.py:tiny"):
        assert config_lib.load(str(REPO / "configs" / spec)).optimizer.name == "adamw", spec
    for spec in ("wmt.py:base", "multi30k.py"):  # Vaswani et al.: Adam, bias-corrected
        assert config_lib.load(str(REPO / "configs" / spec)).optimizer.name == "adam", spec


def test_adam_weight_decay_is_googles_optimization_py():
    """5 steps of clipping, warmup then decay, and decay with BERT's exclusions: equal to
    Google's optimization.py to 1e-6."""
    got, google = five_steps("adam_weight_decay")
    for path, name in GOOGLE_NAMES.items():
        a, b = got, google
        for key in path:
            a, b = a[key], b[key]
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)


def test_adamw_is_not_googles_optimizer():
    """The bias-corrected AdamW moves the same parameters elsewhere (so the test above can fail)."""
    got, google = five_steps("adamw")
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), got, google)
    assert min(jax.tree.leaves(diff)) > 1e-3, diff


# --- ModernBERT's optimisation: StableAdamW, warmup-stable-decay, batch size warmup -----------

def wsd(**kw) -> ml_collections.ConfigDict:
    return sched("wsd", **{"decay_shape": "1-sqrt", "final_fraction": 0.0, **kw})


@pytest.mark.parametrize("shape, expected", [
    # warmup c / 10 up to c = 10, the peak until c = 110 - 40 = 70, then with p = (c - 70) / 40:
    # 1-sqrt: 0.1 + 0.9 * (1 - sqrt(p)); linear: 0.1 + 0.9 * (1 - p); 0.1 from c = 110 on.
    ("1-sqrt", [0.0, 0.5, 1.0, 1.0, 0.55, 0.1 + 0.9 * (1 - np.sqrt(35 / 40)), 0.1, 0.1]),
    ("linear", [0.0, 0.5, 1.0, 1.0, 0.775, 0.2125, 0.1, 0.1]),
])
def test_wsd_is_the_trapezoid(shape, expected):
    steps = [0, 5, 10, 70, 80, 105, 110, 500]
    s = optim.make_schedule(wsd(warmup_steps=10, decay_steps=40, final_fraction=0.1, decay_shape=shape),
                            1.0, 110)
    np.testing.assert_allclose(values(s, steps), expected, rtol=1e-6, atol=1e-7)
    # decay_fraction: the same 40 decay steps as a quarter of a 160-step run
    f = optim.make_schedule(wsd(warmup_steps=10, decay_fraction=0.25, final_fraction=0.1,
                                decay_shape=shape), 1.0, 160)
    np.testing.assert_allclose(values(f, [s + 50 for s in steps[3:]]), expected[3:], rtol=1e-6, atol=1e-7)
    # no decay: warmup, then the peak to the end
    flat = optim.make_schedule(wsd(warmup_steps=10), 2.0, 110)
    np.testing.assert_allclose(values(flat, [5, 10, 109]), [1.0, 2.0, 2.0], rtol=1e-6)


@pytest.mark.parametrize("cfg, key", [
    (wsd(decay_steps=101), "schedule.decay_steps=101"),
    (wsd(warmup_steps=10, decay_fraction=0.95), "schedule.decay_fraction=0.95"),
    (wsd(decay_steps=10, decay_fraction=0.1), "set one of them to 0"),
    (wsd(decay_shape="cosine"), "schedule.decay_shape='cosine'"),
    (wsd(final_fraction=-0.5), "schedule.final_fraction=-0.5"),
    (wsd(decay_steps=-1), "schedule.decay_steps=-1"),
])
def test_bad_wsd_names_the_key(cfg, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        optim.make_schedule(cfg, 1.0, 100)


def optimi_stable_adamw(params: dict, grads: list, lrs: list, peak_lr: float, b1: float, b2: float,
                        eps: float, weight_decay: float) -> tuple[dict, float]:
    """optimi's StableAdamW step (optimi/stableadamw.py, _single_param_stableadamw, decouple_lr
    with max_lr = the optimizer's lr) in numpy, float64, `lrs` the scheduled lr of each step;
    decay on tensors of 2+ dims (ModernBERT's param_groups_weight_decay). Returns the params
    and the largest per-tensor RMS seen (> 1: the clipping acted)."""
    params = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    largest = 0.0
    for step, (grad, lr) in enumerate(zip(grads, lrs), start=1):
        # optimi.utils.debias_beta: betas with Adam's bias correction folded in
        b1_hat = (b1**step - b1) / (b1**step - 1)
        b2_hat = (b2**step - b2) / (b2**step - 1)
        for name, p in params.items():
            g = grad[name]
            m[name] = m[name] + (1 - b1_hat) * (g - m[name])  # lerp_
            v[name] = v[name] * b2_hat + (1 - b2_hat) * g * g
            rms = np.sqrt(np.mean(g**2 / np.maximum(v[name], eps**2)))
            largest = max(largest, rms)
            lr_t = lr / max(1.0, rms)
            if p.ndim > 1:
                p = p * (1 - (lr_t / peak_lr) * weight_decay)
            params[name] = p - lr_t * m[name] / (np.sqrt(v[name]) + eps)
    return params, largest


def test_stable_adamw_is_optimis():
    """5 steps of a wsd schedule (warmup, peak, decay) with a gradient spike, weight decay on
    kernels and embeddings only: equal to optimi's StableAdamW in numpy to 1e-6."""
    config = run_config("stable_adamw", "wsd", learning_rate=0.01, b2=0.98, weight_decay=0.1)
    config.schedule.update(warmup_steps=1, decay_steps=2, final_fraction=0.0, decay_shape="linear")
    config.train.steps = 5
    tx, _ = optim.make_optimizer(config)
    rng = np.random.default_rng(0)
    start = {k: rng.normal(size=s) for k, s in SHAPES.items()}
    grads = [{k: scale * rng.normal(size=s) for k, s in SHAPES.items()}
             for scale in (0.5, 0.4, 20.0, 0.3, 0.5)]  # the third: a spike
    params = ours(start)
    state, update = tx.init(params), jax.jit(tx.update)
    for g in grads:
        updates, state = update(ours(g), state, params)
        params = optax.apply_updates(params, updates)
    # wsd, c = 0..4 of 5: 0 at c = 0 (warmup), 0.01 up to c = 3 = 5 - 2, then linear to 0 at c = 5
    lrs = [0.0, 0.01, 0.01, 0.01, 0.005]
    want, largest = optimi_stable_adamw(start, grads, lrs, 0.01, 0.9, 0.98, 1e-6, 0.1)
    assert largest > 1.5  # the spike was clipped (RMS 1.7: v_hat holds the spike itself)
    for path, name in GOOGLE_NAMES.items():
        got = params
        for key in path:
            got = got[key]
        np.testing.assert_allclose(got, want[name], rtol=0, atol=1e-6, err_msg=name)


def test_stable_adamw_clips_only_a_spike():
    """A steady gradient: the same steps as adamw (v_hat = g^2, RMS 1). A 30x spike: adamw's
    step divided by the RMS of g / sqrt(v_hat), computed here."""
    b2 = 0.98
    g = {"kernel": jnp.asarray([[0.1, -0.2], [0.3, 0.05]]), "bias": jnp.asarray([0.2, -0.1])}
    p = jax.tree.map(jnp.ones_like, g)
    steps = {}
    for name in ("stable_adamw", "adamw"):
        tx, _ = optim.make_optimizer(run_config(name, b2=b2))
        state, out, update = tx.init(p), [], jax.jit(tx.update)
        for scale in (1.0, 1.0, 1.0, 30.0):
            updates, state = update(jax.tree.map(lambda x, s=scale: s * x, g), state, p)
            out.append(updates)
        steps[name] = out
    for stable, adamw in zip(steps["stable_adamw"][:3], steps["adamw"][:3]):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), stable, adamw)
    # v_hat after 3 steps of g^2 and one of (30 g)^2, per element: g^2 * c.
    c = ((1 - b2) * (b2**3 + b2**2 + b2) + (1 - b2) * 900) / (1 - b2**4)
    rms = 30 / np.sqrt(c)
    assert rms > 1.9  # v_hat holds the spike itself: early in a run the RMS stays small
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a * rms, b, rtol=1e-5),
                 steps["stable_adamw"][3], steps["adamw"][3])


def test_stable_adamw_needs_a_positive_eps():
    with pytest.raises(ValueError, match=r"optimizer\.eps=0\.0 must be > 0"):
        optim.make_optimizer(run_config("stable_adamw", eps=0.0))


BATCH_WARMUP = ["data.name=synthetic", "model.vocab_size=128", "model.num_layers=1", "model.emb_dim=32",
                "model.num_heads=2", "model.head_dim=16", "model.mlp_dim=64", "train.batch_size=16",
                "train.grad_accum_steps=2", "train.log_every=1", "train.eval_steps=1",
                "schedule.name=constant", "schedule.warmup_steps=0", "train.steps=6",
                "data.phases=((0, 16, 3, 8), (3, 16, 3, 16))", "train.checkpoint_every=2"]


def test_phase_batch_keeps_the_microbatch():
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), BATCH_WARMUP)
    for step, (index, batch, accum) in [(0, (0, 8, 1)), (2, (0, 8, 1)), (3, (1, 16, 2))]:
        i, cfg, _ = config_lib.phase_config(config, step)
        assert (i, cfg.train.batch_size, cfg.train.grad_accum_steps) == (index, batch, accum)
    config.data.phases = ((0, 16, 3, 12), (3, 16, 3))
    with pytest.raises(config_lib.ConfigError, match=r"data\.phases\[0\] batch 12 .* multiple of 8"):
        config_lib.validate(config, 8)


def test_a_batch_phase_reads_on_from_the_phase_before():
    """Phase 1 (16 rows) goes on with the microbatches after phase 0's 3 x 8 rows, both when the
    run goes on and when it resumes from a position saved in phase 0; none is read twice."""
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), BATCH_WARMUP)
    micro = pipelines.make(config_lib.phase_config(config, 0)[1], "train", batch_size=8)
    stream = [next(micro)["input_ids"] for _ in range(7)]
    _, cfg0, _ = config_lib.phase_config(config, 0)
    _, cfg1, _ = config_lib.phase_config(config, 3)
    p0 = train._phase_pipeline(config, cfg0, 0, {}, None, None)
    assert [next(p0)["input_ids"].tolist() for _ in range(3)] == [s.tolist() for s in stream[:3]]
    saved = {"phase": 0, "pipeline": p0.get_state()}
    goes_on = train._phase_pipeline(config, cfg1, 1, {}, types.SimpleNamespace(index=0, pipeline=p0), None)
    resumed = train._phase_pipeline(config, cfg1, 1, saved, None, None)
    for pipeline in (goes_on, resumed):
        for i in (3, 5):
            np.testing.assert_array_equal(next(pipeline)["input_ids"], np.concatenate(stream[i:i + 2]))


@pytest.mark.slow  # two phases compiled (~10 s of CPU), as the length phases' test
def test_batch_size_warmup_trains_and_resumes_exactly(tmp_path, caplog):
    """Batch 8 for 3 steps, then 16 (two microbatches of 8); a run that lost its last checkpoint
    resumes in the second phase and repeats the same losses."""
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), BATCH_WARMUP)
    with caplog.at_level("INFO", logger="bert_jax.training.train"):
        train.train_and_evaluate(config, str(tmp_path))
    phases = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase ")]
    assert [p.split(";")[0] for p in phases] == [
        "phase 0 from step 0: batch 8 x 16 tokens in 1 microbatch(es)",
        "phase 1 from step 3: batch 16 x 16 tokens in 2 microbatch(es)"]
    first = {r["step"]: r["loss"] for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "loss" in r}
    shutil.rmtree(tmp_path / "checkpoints" / "6")  # as if killed before saving step 6
    train.train_and_evaluate(config, str(tmp_path))  # resumes at 4, in the 16-row phase
    again = {r["step"]: r["loss"] for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "loss" in r}
    assert len(first) == 6 and again == first


@pytest.mark.slow  # two phases compiled, as the test above
def test_stages_and_a_phase_microbatch_train(tmp_path, caplog):
    """A run in two schedule stages whose second phase accumulates its own microbatch: the
    logged learning rates restart at the stage, the phase's batch is 2 microbatches of 16
    rows, and the checkpoint where the first stage ends is kept beside the newest, to decay
    from in another way."""
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), BATCH_WARMUP + [
        "data.phases=((0, 16, 3, 8), {'start_step': 3, 'seq_len': 16, 'predictions': 3, "
        "'batch_size': 32, 'microbatch': 16})",
        "schedule.name=warmup_linear", "schedule.warmup_steps=10", "train.keep_checkpoints=1",
        "schedule.stages=({'start_step': 0, 'learning_rate': 0.01}, {'start_step': 3, "
        "'name': 'wsd', 'learning_rate': 0.005, 'decay_fraction': 1.0})"])
    with caplog.at_level("INFO", logger="bert_jax.training.train"):
        train.train_and_evaluate(config, str(tmp_path))
    phases = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase ")]
    assert phases[1].split(";")[0] == "phase 1 from step 3: batch 32 x 16 tokens in 2 microbatch(es)"
    rates = [r["learning_rate"] for r in metrics.read_metrics(tmp_path / "metrics.jsonl")
             if "loss" in r]
    # Updates 0-2 at 0.01, then the stage's 1-sqrt decay over its 3 updates from 0.005.
    want = [0.01] * 3 + [0.005 * (1 - math.sqrt(c / 3)) for c in range(3)]
    np.testing.assert_allclose(rates, want, rtol=1e-6)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [3, 6]
    # Another decay from the first stage's end: its checkpoint copied into a new workdir.
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "checkpoints" / "3", other / "checkpoints" / "3")
    config.schedule.stages = (config.schedule.stages[0], dict(
        start_step=3, name="wsd", learning_rate=0.002, decay_fraction=1.0, decay_shape="linear"))
    caplog.clear()
    with caplog.at_level("INFO", logger="bert_jax.training.train"):
        train.train_and_evaluate(config, str(other))
    assert f"resumed from {other}/checkpoints/3" in caplog.text
    rates = [r["learning_rate"] for r in metrics.read_metrics(other / "metrics.jsonl") if "loss" in r]
    np.testing.assert_allclose(rates, [0.002 * (1 - c / 3) for c in range(3)], rtol=1e-6)
