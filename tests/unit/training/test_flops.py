"""FLOPs honesty: the analytic training FLOPs that MFU divides by (each objective's `flops`,
from the models' flops_per_token) agree with XLA's own count of the train step (its cost
analysis) within 5%, for each family and attention pattern whose
computation XLA can see (the xla kernel; splash and cuDNN are custom calls it cannot count).

XLA's count includes what the analytic count leaves out (layer norms, softmax, activations,
dropout's random bits, the optimizer), all a few percent at these widths. Two facts the test
pins rather than hides: XLA counts a scanned layer stack's body once (so the tests count
unrolled layers), and the xla kernel computes every key of a local window's layer and masks
the rest, while MFU counts the window's keys only (model FLOPs).

The families are counted on the lowered step (XLA's cost analysis of the whole program, before
it is partitioned over the devices: a second where a compile is seven); one test compiles a
step and finds its devices' counts adding up to the lowered one's, within 3%."""

import functools

import jax
import numpy as np
import pytest
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax.models import masking
from bert_jax.training import setup, sharding, train

# A width at which matmuls dominate as they do at BERT-Base (head dim 64, FFN 4x), 2 layers.
SMALL = ["model.num_layers=2", "model.emb_dim=256", "model.num_heads=4", "model.head_dim=64",
         "model.mlp_dim=1024", "model.scan_layers=false", "mesh.data=1", "mesh.fsdp=-1",
         "train.batch_size=8"]
PRETRAIN = [*SMALL, "model.vocab_size=1024", "data.phases=()", "data.max_seq_length=128"]
MODERN = ["configs/modernbert.py:base", *PRETRAIN, "schedule.stages=()",
          "data.max_predictions_per_seq=39"]
CASES = {
    "bert MLM + NSP, dropout": ["configs/bert_pretrain.py:base", *PRETRAIN,
                                "data.max_predictions_per_seq=20"],
    "modernbert, every layer global": [*MODERN, "model.attention_window=0",
                                       "model.attention_global_every=0"],
    "linformer": ["configs/bert_pretrain.py:base", *PRETRAIN, "data.max_predictions_per_seq=20",
                  "model.attention_pattern=linformer", "model.linformer_k=32"],
    "classification": ["configs/glue.py:sst2", *SMALL, "model.vocab_size=1024",
                       "data.max_seq_length=128", "data.pack=false", "train.steps=100"],
    "transformer (encoder-decoder)": ["configs/multi30k.py", *SMALL, "model.num_decoder_layers=2",
                                      "model.vocab_size=1024", "data.max_seq_length=64"],
}


def _batch(spec: dict, vocab: int) -> dict[str, np.ndarray]:
    """Every token real, every label valid: random words, masked positions distinct."""
    rng = np.random.default_rng(0)
    out = {}
    for key, s in spec.items():
        if key == "masked_lm_positions":
            B, P = s.shape
            T = spec["input_ids"].shape[-1]
            value = np.sort(np.stack([rng.choice(np.arange(1, T), P, replace=False)
                                      for _ in range(B)]), axis=1)
        elif key.endswith(("mask", "segment_ids", "weights")):
            value = np.ones(s.shape)
        elif key.endswith("positions"):
            value = np.broadcast_to(np.arange(s.shape[-1]), s.shape)
        elif key.endswith("labels") or key == "label_ids":
            value = rng.integers(0, 2, s.shape)
        else:  # ids, inputs, targets
            value = rng.integers(5, vocab, s.shape)
        out[key] = np.asarray(value, s.dtype)
    return out


def _lowered_and_analytic(overrides: list[str]) -> tuple[float, float, object]:
    """(XLA's count of the lowered step, the analytic count, the config)."""
    lowered, analytic, config = _lower_once(tuple(overrides))
    cost = lowered.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return cost["flops"], analytic, config


@functools.cache  # each case lowered once a session: the windows test reuses the global one's
def _lower_once(overrides: tuple[str, ...]) -> tuple[object, float, object]:
    path, *rest = overrides
    config = config_lib.load(str(REPO / path), rest)
    engine = setup.build(config, sharding.make_mesh(config.mesh))
    with jax.set_mesh(engine.mesh):
        step = train.jit_train_step(config, engine.graphdef, engine.objective, engine.tx,
                                    engine.schedule, engine.mesh, engine.state_sh)
        batch = sharding.global_batch(_batch(engine.objective.batch_spec(config),
                                             config.model.vocab_size), engine.mesh, 1)
        lowered = step.lower(engine.train_state(), batch)
        analytic = float(jax.jit(engine.objective.flops)(batch))
    return lowered, analytic, config


@functools.cache
def _compiled(overrides: tuple[str, ...]) -> float:
    """XLA's count of the compiled step, summed over the devices (each runs its part)."""
    cost = _lower_once(overrides)[0].compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return cost["flops"] * jax.device_count()


@pytest.mark.parametrize("case", list(CASES))
def test_analytic_training_flops_agree_with_xlas_count(case):
    lowered, analytic, _ = _lowered_and_analytic(CASES[case])
    assert lowered == pytest.approx(analytic, rel=0.05), (case, lowered / analytic)


def test_the_devices_compiled_steps_count_what_the_lowered_step_does():
    """The fsdp-sharded BERT step compiled: the 8 devices' counts add up to the lowered
    program's (measured 1.6% more: what partitioning adds), so counting the lowered steps above
    counts what the devices run."""
    case = tuple(CASES["bert MLM + NSP, dropout"])
    assert _compiled(case) == pytest.approx(_lowered_and_analytic(list(case))[0], rel=0.03)


def test_local_windows_count_the_windows_keys_while_xla_computes_every_key():
    """With a window not much shorter than the row (32 each side of 128 tokens: the dense path
    of models/kernels/xla.py, which bands only windows of at most half the row) the xla kernel
    masks a local layer's far keys after computing them; MFU counts only the window's keys
    (masking.attention_keys). So XLA counts the same FLOPs with and without windows, and the
    analytic count of the windowed model plus the masked keys' matmuls gives the all-global
    model's ratio to XLA's count."""
    every_global = _lowered_and_analytic(CASES["modernbert, every layer global"])
    lowered, analytic, config = _lowered_and_analytic([*MODERN, "model.attention_window=32"])
    assert lowered == pytest.approx(every_global[0], rel=1e-3)
    cfg = config_lib.resolve(config).model
    T = config.data.max_seq_length
    masked_keys = T - masking.attention_keys(cfg, T)  # per query, averaged over the layers
    per_key = 3 * 2 * 2 * cfg.num_heads * cfg.head_dim * cfg.num_layers  # QK^T and AV, fwd + bwd
    masked = per_key * masked_keys * config.train.batch_size * T
    reference = every_global[0] / every_global[1]
    assert lowered / analytic != pytest.approx(reference, rel=3e-3)  # the window counts less
    assert lowered / (analytic + masked) == pytest.approx(reference, rel=3e-3)


@pytest.mark.slow  # two more compiles, of a fact about XLA rather than about us
def test_xla_counts_a_scanned_layer_stack_once():
    """Why the test above compiles unrolled layers: under lax.scan XLA's cost analysis counts the
    layer body once, so a 2-layer scanned BERT counts about half of the unrolled one."""
    case = CASES["bert MLM + NSP, dropout"]
    unrolled = _compiled(tuple(case))
    scanned = _compiled((*case, "model.scan_layers=true"))
    assert 0.45 < scanned / unrolled < 0.65, scanned / unrolled
