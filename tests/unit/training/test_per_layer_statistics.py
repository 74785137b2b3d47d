"""Per-tensor optimizer statistics are per tensor of the reference, not per leaf of ours: a
stack's layers are one leaf with a leading layer axis, so StableAdamW's update RMS and LAMB's
trust ratio are taken per layer slice, and StableAdamW's over q, k, v together and the two
GLU halves together, as ModernBERT's PyTorch model fuses them (Wqkv, Wi). A gradient spike in
one layer shrinks that layer's step only."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config as config_lib
from bert_jax.training import optim

L, D, H, K, F, V = 3, 8, 2, 4, 12, 10
SHAPES = {  # a ModernBERT-like tree: stacked layers, q/k/v and GLU halves as separate leaves
    ("bert", "embeddings", "word", "embedding"): (V, D),
    ("bert", "encoder", "layers", "attention", "query", "kernel"): (L, D, H, K),
    ("bert", "encoder", "layers", "attention", "key", "kernel"): (L, D, H, K),
    ("bert", "encoder", "layers", "attention", "value", "kernel"): (L, D, H, K),
    ("bert", "encoder", "layers", "attention", "out", "kernel"): (L, H, K, D),
    # (layers 1..: the first layer reads the normalised embeddings, without an attention norm)
    ("bert", "encoder", "layers", "attention_norm", "scale"): (L - 1, D),
    ("bert", "encoder", "layers", "mlp", "wi", "kernel"): (L, D, F),
    ("bert", "encoder", "layers", "mlp", "wi_gate", "kernel"): (L, D, F),
    ("bert", "encoder", "layers", "mlp", "wo", "kernel"): (L, F, D),
}
FUSED = {"query": "Wqkv", "key": "Wqkv", "value": "Wqkv", "wi": "Wi", "wi_gate": "Wi"}
SPIKE_STEP, SPIKE_LAYER = 6, 1


def tree(flat: dict) -> dict:
    out: dict = {}
    for path, x in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(x, jnp.float32)
    return out


def leaf(t: dict, path: tuple):
    for key in path:
        t = t[key]
    return np.asarray(t)


def draws(steps: int = 10) -> tuple[dict, list]:
    rng = np.random.default_rng(0)
    start = {p: rng.normal(size=s) * 0.1 for p, s in SHAPES.items()}
    grads = []
    for step in range(1, steps + 1):
        g = {p: rng.normal(size=s) * 0.5 for p, s in SHAPES.items()}
        if step == SPIKE_STEP:  # one layer's gradients spike
            for p in g:
                if "layers" in p:
                    g[p][SPIKE_LAYER] *= 30.0
        grads.append(g)
    return start, grads


def reference_tensors() -> dict:
    """The reference's tensors: name -> [(our leaf path, layer or None)], in fusing order."""
    out: dict = {}
    for path in SHAPES:
        if "layers" not in path:
            out.setdefault(path, []).append((path, None))
            continue
        module = FUSED.get(path[-2], path[-2])
        for layer in range(SHAPES[path][0]):  # each row (a layer) its own tensor
            out.setdefault((*path[:-2], module, path[-1], layer), []).append((path, layer))
    return out


def optimi_steps(start: dict, grads: list, lr: float, b1: float, b2: float, eps: float,
                 wd: float) -> tuple[dict, dict]:
    """optimi's StableAdamW (decouple_lr, max_lr = lr, constant lr) on the reference's tensors
    in float64, each the concatenation of its slices; (params by our leaf, the RMS of each
    reference tensor at the spike step)."""
    params = {p: np.array(x, np.float64) for p, x in start.items()}
    tensors = reference_tensors()
    m = {n: 0.0 for n in tensors}
    v = {n: 0.0 for n in tensors}
    spike = {}

    def flat(values, parts):
        return np.concatenate([(values[p] if i is None else values[p][i]).ravel() for p, i in parts])

    for step, g_all in enumerate(grads, start=1):
        b1_hat = (b1**step - b1) / (b1**step - 1)  # optimi.utils.debias_beta
        b2_hat = (b2**step - b2) / (b2**step - 1)
        for name, parts in tensors.items():
            g, p = flat(g_all, parts), flat(params, parts)
            m[name] = m[name] + (1 - b1_hat) * (g - m[name])
            v[name] = v[name] * b2_hat + (1 - b2_hat) * g * g
            rms = np.sqrt(np.mean(g**2 / np.maximum(v[name], eps**2)))
            if step == SPIKE_STEP:
                spike[name] = rms
            lr_t = lr / max(1.0, rms)
            if parts[0][0][-1] in ("kernel", "embedding"):  # decayed, as decay_mask
                p = p * (1 - (lr_t / lr) * wd)
            p = p - lr_t * m[name] / (np.sqrt(v[name]) + eps)
            at = 0
            for path, i in parts:  # back into our leaves
                target = params[path] if i is None else params[path][i]
                target[...] = p[at:at + target.size].reshape(target.shape)
                at += target.size
    return params, spike


def run(name: str, start: dict, grads: list, **optimizer) -> dict:
    config = config_lib.load("configs/modernbert.py:tiny")
    config.optimizer.update(name=name, grad_clip_norm=0.0, **optimizer)
    config.schedule.update(name="constant", warmup_steps=0)
    tx, _ = optim.make_optimizer(config)
    params = tree(start)
    state, update = tx.init(params), jax.jit(tx.update)
    for g in grads:
        updates, state = update(tree(g), state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_stable_adamw_clips_per_layer_and_fused_tensor_as_the_reference():
    start, grads = draws()
    got = run("stable_adamw", start, grads, learning_rate=0.01, b1=0.9, b2=0.98, eps=1e-6,
              weight_decay=0.1)
    want, spike = optimi_steps(start, grads, 0.01, 0.9, 0.98, 1e-6, 0.1)
    # The spike layer's tensors were clipped; the other layers' were not.
    spiked = [r for n, r in spike.items() if n[-1] == SPIKE_LAYER]
    calm = [r for n, r in spike.items() if len(n) > 4 and n[-1] != SPIKE_LAYER]
    assert min(spiked) > 1.5 and max(calm) < 1.2
    for path in SHAPES:
        np.testing.assert_allclose(leaf(got, path), want[path], rtol=0, atol=1e-6,
                                   err_msg="/".join(path))


def test_lamb_trust_ratio_is_per_layer():
    """LAMB on the stacked tree equals optax.lamb on the same layers as separate variables (the
    reference's one variable a layer and tensor)."""
    start, grads = draws(5)
    got = run("lamb", start, grads, learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-6,
              weight_decay=0.01)

    def split(flat):  # each stacked leaf -> one variable per layer
        return {(*p, f"layer_{i}") if "layers" in p else p: (x[i] if "layers" in p else x)
                for p, x in flat.items() for i in (range(len(x)) if "layers" in p else [0])}

    mask = lambda t: jax.tree_util.tree_map_with_path(
        lambda p, _: any(getattr(k, "key", None) in ("kernel", "embedding") for k in p), t)
    tx = optax.lamb(0.01, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask)
    params = tree(split(start))
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(tree(split(g)), state, params)
        params = optax.apply_updates(params, updates)
    for path in SHAPES:
        for i in range(SHAPES[path][0]) if "layers" in path else [None]:
            want = leaf(params, (*path, f"layer_{i}") if i is not None else path)
            mine = leaf(got, path)[i] if i is not None else leaf(got, path)
            np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-7, err_msg=f"{path} {i}")


@pytest.mark.parametrize("name", ["stable_adamw", "lamb"])
def test_an_unstacked_tree_is_unchanged(name):
    """Leaves without a layer axis keep the per-leaf statistic (one tensor each)."""
    x = {"a": {"kernel": jnp.arange(6.0).reshape(2, 3)}, "b": {"scale": jnp.ones(3)}}
    means = optim.tensor_mean(jax.tree.map(jnp.square, x))
    assert means["a"]["kernel"].shape == () and float(means["a"]["kernel"]) == pytest.approx(55 / 6)
