"""The engine shared by every model: no import cycles, one objective interface (batch
shapes, real tokens, FLOPs), the Transformer configs trained through the same loop."""

import ast
import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import LATE_IMPORTS, REPO

from bert_jax import config as config_lib
from bert_jax import models, tasks
from bert_jax.training import metrics, objectives, optim, sharding, train
from bert_jax.training import state as state_lib

PACKAGE = REPO / "bert_jax"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in its body (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m in modules}


def test_no_import_cycle_in_the_package():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _imports(p, set(files)) - {m} for m, p in files.items()}
    for file, module in LATE_IMPORTS:  # made inside a function, once both modules are loaded
        graph[_module_name(REPO / file)] -= {module}
    # the walk sees edges
    assert graph["bert_jax.training.train"] >= {"bert_jax.training.state", "bert_jax.training.evaluate"}

    state: dict[str, str] = {}  # module -> "visiting" | "done"

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "visiting"
        for n in sorted(graph[m]):
            if n.startswith(m + ".") or m.startswith(n + ".") and n == "bert_jax":
                continue  # a package and its own submodules
            if state.get(n) == "visiting":
                cycle = stack[stack.index(n):] + [n] if n in stack else stack + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_model_name_switch_outside_the_model_files():
    """Model names appear only in the models package (its registry and model files), the
    objectives registry and the Hugging Face name mapping (interop/convert.py, export.py and the
    families, interop/families/); the engine asks the model or its objective instead."""
    names = [n for n in models.MODELS if n != "bert"]
    allowed = {"training/objectives.py", "training/contrastive.py", "interop/convert.py",
               "interop/export.py"}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel in allowed or rel.startswith(("models/", "interop/families/")):
            continue
        text = path.read_text()
        for name in names:
            assert f'"{name}"' not in text, f"{path.name} switches on model name {name!r}"


def _pretraining_batch():
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), [
        "data.name=synthetic", "model.vocab_size=256", "train.batch_size=4",
        "data.max_seq_length=16", "data.max_predictions_per_seq=3"])
    from bert_jax.training import input as pipelines

    return config, next(pipelines.make(config, "train"))


def test_objective_counts_real_tokens_and_their_flops():
    config, batch = _pretraining_batch()
    batch["attention_mask"][:, 10:] = 0  # padding: neither tokens nor FLOPs
    objective = objectives.for_config(config)
    assert {k: (v.shape, v.dtype) for k, v in objective.batch_spec(config).items()} == {
        k: (v.shape, v.dtype) for k, v in batch.items()}
    per_token = models.flops_per_token(config_lib.model_config(config), 16)
    tokens = batch["attention_mask"].sum()
    assert float(objective.tokens(batch)) == tokens
    want = 3 * (per_token["encoder_per_token"] * tokens
                + per_token["mlm_head_per_predicted_token"] * batch["masked_lm_weights"].sum())
    np.testing.assert_allclose(float(objective.flops(batch)), want, rtol=1e-6)


def tiny_wmt(*overrides: str):
    return config_lib.load(str(REPO / "configs/wmt.py:base"), [
        "data.name=synthetic_translation", "data.max_seq_length=10", "model.vocab_size=40",
        "model.emb_dim=64", "model.num_heads=4", "model.head_dim=16", "model.mlp_dim=128",
        "model.num_layers=2", "model.num_decoder_layers=2", "model.dropout_rate=0.0",
        "model.attention_dropout_rate=0.0", "train.batch_size=32", "train.steps=300",
        "train.log_every=50", "train.eval_every=300", "train.eval_steps=2",
        "train.checkpoint_every=300", "schedule.warmup_steps=40", "optimizer.learning_rate=0.5",
        *overrides])


def test_wmt_configs_are_complete_training_configs():
    for size in ("base", "big"):
        config = config_lib.load(str(REPO / f"configs/wmt.py:{size}"), [])
        config_lib.validate(config, 8)
        objective = objectives.for_config(config)
        spec = objective.batch_spec(config)
        assert spec["inputs"].shape == spec["targets"].shape == (128, 256)
        mesh = sharding.make_mesh(config.mesh)
        _, abstract, _ = state_lib.abstract_state(config, mesh, optim.make_optimizer(config)[0])
        assert set(abstract) == {"params", "opt_state", "step"}
        assert objective.label_smoothing == 0.1 and config.optimizer.b2 == 0.98


def test_plain_wmt_train_names_the_missing_tokenizer(tmp_path):
    config = tiny_wmt("data.name=translation")
    with pytest.raises(ValueError, match="data.tokenizer is empty"):
        train.train_and_evaluate(config, str(tmp_path))


@pytest.mark.slow
def test_transformer_trains_through_the_engine(tmp_path):
    summary = train.train_and_evaluate(tiny_wmt(), str(tmp_path))
    rows = metrics.read_metrics(tmp_path / "metrics.jsonl")
    logged = [r for r in rows if "loss" in r]
    assert summary["step"] == 300 and [r["step"] for r in logged] == [50, 100, 150, 200, 250, 300]
    assert logged[-1]["loss"] < logged[0]["loss"] - 1.0
    # Reversing the source: far above chance (1 / 36 words) once the model attends to it.
    assert summary["eval"]["eval/token_accuracy"] > 0.5, summary["eval"]
    # Tokens counted are the real ones: on average (1 + 10) / 2 per side and row.
    per_step = logged[-1]["tokens_per_sec"] / logged[-1]["steps_per_sec"]
    assert 0.7 * 32 * 11 < per_step < 1.3 * 32 * 11
    assert 0 < logged[-1]["mfu"] < 1


def test_label_smoothing_is_rejected_where_there_is_nothing_to_smooth():
    config, _ = _pretraining_batch()
    config.train.label_smoothing = 0.1
    with pytest.raises(config_lib.ConfigError, match="label_smoothing"):
        objectives.for_config(config)


def test_label_smoothing_matches_the_formula():
    cfg = dict(name="transformer", **models.transformer_model_fields("base"))
    logits = jax.random.normal(jax.random.key(0), (2, 3, 7))
    targets = jnp.array([[1, 2, 0], [3, 4, 5]])
    w = (targets > 0).astype(jnp.float32)
    terms, m = objectives.for_model(cfg, 0.1).token_loss(logits, targets, w)
    logp = np.asarray(jax.nn.log_softmax(logits))
    soft = np.full((2, 3, 7), 0.1 / 7) + 0.9 * np.eye(7)[np.asarray(targets)]
    want = -(soft * logp).sum(-1)
    np.testing.assert_allclose(float(terms["targets"]), (want * np.asarray(w)).sum(), rtol=1e-5)
    assert float(m["token_accuracy"][1]) == 5


def test_decoder_lm_objective_trains_a_step():
    cfg = models.model_section("decoder_lm", models.transformer_model_fields("base", vocab_size=50))
    cfg.update(emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=2)
    config = config_lib.training_defaults()
    config.model = cfg
    config.data = {"max_seq_length": 8}
    config.train.batch_size = 8
    objective = objectives.for_config(config)
    spec = objective.batch_spec(config)
    rng = np.random.default_rng(0)
    targets = rng.integers(1, 50, (8, 8)).astype(np.int32)
    targets[:, 6:] = 0
    batch = {"targets": targets, "targets_segment_ids": (targets > 0).astype(np.int32),
             "targets_positions": np.broadcast_to(np.arange(8, dtype=np.int32), (8, 8)).copy()}
    assert {k: (v.shape, v.dtype) for k, v in spec.items()} == {
        k: (v.shape, v.dtype) for k, v in batch.items()}
    tx, schedule = optim.make_optimizer(config)
    mesh = sharding.make_mesh(config.mesh)
    graphdef, _, state_sh = state_lib.abstract_state(config, mesh, tx)
    step = jax.jit(functools.partial(train.train_step, graphdef=graphdef, objective=objective,
                                     tx=tx, schedule=schedule, accum=1, mesh=mesh,
                                     dropout_key=jax.random.key(0)))
    with jax.set_mesh(mesh):
        _, m = step(state_lib.init_state(config, tx, state_sh), sharding.global_batch(batch, mesh, 1))
    assert abs(float(m["loss"]) - math.log(50)) < 0.5  # about uniform at init
    assert float(m["tokens"]) == 8 * 6


def test_compute_dtype_is_set_once():
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), ["dtype=bfloat16"])
    assert "dtype" not in config.model
    assert config_lib.model_config(config)["dtype"] == "bfloat16"
    config.model.dtype = "float32"
    with pytest.raises(config_lib.ConfigError, match="model.dtype='float32' differs"):
        config_lib.validate(config, 8)



def _keys(section, prefix=""):
    return {k for key, value in section.items()
            for k in (_keys(value, f"{prefix}{key}.") if hasattr(value, "items") else [prefix + key])}


@pytest.mark.parametrize("spec,defaults", [
    ("bert_pretrain.py:base", config_lib.pretraining_defaults),
    ("bert_pretrain.py:tiny", config_lib.pretraining_defaults),
    *[(f"{task}.py", functools.partial(config_lib.finetune_defaults, task))
      for task in ("glue", "ner", "squad", "swag")],
    ("wmt.py:big", config_lib.translation_defaults),
    ("multi30k.py", config_lib.translation_defaults)])
def test_config_files_set_values_the_defaults_define(spec, defaults):
    """Every default lives in config.py: a config file adds its model and no key of its own."""
    config = config_lib.load(str(REPO / "configs" / spec))
    assert _keys(config.to_dict()) - _keys({"model": config.model.to_dict()}) == _keys(
        defaults().to_dict())


class _Task:
    def num_train_examples(self):
        return 1000


def test_user_train_steps_are_not_replaced_by_epochs():
    config = config_lib.load(str(REPO / "configs/glue.py:sst2,tiny"), [])
    assert config.train.steps == 0 and config.train.epochs == 3.0
    derived = tasks.resolve_steps(config_lib.resolve(config), _Task())
    assert derived.train.steps == math.ceil(3 * 1000 / 32)
    assert derived.schedule.warmup_steps == int(0.1 * derived.train.steps)
    saved = json.loads(derived.saved)  # what checkpoints store says the same
    assert (saved["train"]["steps"], saved["schedule"]["warmup_steps"]) == (
        derived.train.steps, derived.schedule.warmup_steps)
    config.train.steps = 7
    kept = tasks.resolve_steps(config_lib.resolve(config), _Task())
    assert kept.train.steps == 7 and kept.schedule.warmup_steps == 0


def test_warmup_steps_given_by_the_user_win_over_the_config_files_fraction():
    """A fine-tuning config's warmup is 10% of the steps; --config.schedule.warmup_steps replaces
    it (saved so), the fraction given too is refused, and without either the fraction stays."""
    config = config_lib.load(str(REPO / "configs/glue.py:sst2,tiny"),
                             ["train.steps=20", "schedule.warmup_steps=10"])
    assert config.schedule.warmup_fraction == 0.1
    spec = tasks.resolve_steps(config_lib.resolve(config), _Task(), {"schedule.warmup_steps"})
    assert (spec.schedule.warmup_steps, spec.schedule.warmup_fraction) == (10, 0.0)
    assert json.loads(spec.saved)["schedule"]["warmup_fraction"] == 0.0
    # the same config without the key set by the user: the fraction, 10% of 20 steps
    assert tasks.resolve_steps(config_lib.resolve(config), _Task()).schedule.warmup_steps == 2
    with pytest.raises(config_lib.ConfigError, match=r"--config.schedule.warmup_steps=10 and "
                       r"--config.schedule.warmup_fraction=0.1 both set the warmup; give one"):
        config_lib.check_overrides_read(config_lib.resolve(config),
                                        {"schedule.warmup_steps", "schedule.warmup_fraction"})
    config.schedule.warmup_fraction = 0.0  # a fraction of 0 given with steps: no conflict
    config_lib.check_overrides_read(config_lib.resolve(config),
                                    {"schedule.warmup_steps", "schedule.warmup_fraction"})


def test_cadence_decides_eval_and_save_in_one_place():
    t = config_lib.training_defaults().train
    t.steps, t.eval_every, t.checkpoint_every = 100, 30, 50
    due = {s: train.cadence(s, t, preempted=False, keeps_best=False) for s in range(1, 101)}
    assert [s for s, (e, _) in due.items() if e] == [30, 60, 90, 100]
    assert [s for s, (_, save) in due.items() if save] == [50, 100]
    assert train.cadence(60, t, preempted=False, keeps_best=True) == (True, True)
    assert train.cadence(7, t, preempted=True, keeps_best=False) == (False, True)


@pytest.mark.parametrize("platform, says", [
    ("cpu", "model.attention_kernel=cudnn needs a GPU (cuDNN flash attention), not cpu"),
    ("tpu", "model.attention_kernel=cudnn needs a GPU (cuDNN flash attention), not tpu"),
    # on a GPU the kernel runs, so what it cannot compute is what is named
    ("gpu", "model.attention_dropout_rate=0.1 with model.attention_kernel=cudnn"),
])
def test_the_platform_is_named_before_what_the_kernel_refuses_on_it(platform, says):
    from bert_jax.training import setup

    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), [
        "model.attention_kernel=cudnn", "model.attention_dropout_rate=0.1", "dtype=float32"])
    with pytest.raises(config_lib.ConfigError) as e:
        setup.check(config, platform=platform, devices=8, processes=1, reads_data=False)
    assert str(e.value).startswith(says), str(e.value)
