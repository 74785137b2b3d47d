"""Model configs per family (models/config.py): a field the chosen model does not read is an
error naming the field and the model; the checkpoint compatibility lists and the FLOPs count
follow the fields' metadata; checkpoints saved before the per-family configs (their stored
model section holds every model's fields) still load, resume, evaluate and export."""

import dataclasses
import itertools
import json

import jax
import pytest
from flax import nnx
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.models.config import FAMILIES, HF_FAMILIES
from bert_jax.training import checkpoint, sharding, state
from bert_jax.translation import translate

# Model sections exactly as the code before the per-family configs (commit e6599e7) stored
# them: every field of every model. The tiny pretraining run of `test_a_checkpoint_saved_...`
# (configs/bert_pretrain.py:tiny with OLD_RUN's overrides):
OLD_BERT_PRETRAINING = {
    "name": "bert_pretraining", "vocab_size": 100, "emb_dim": 16, "num_layers": 1,
    "num_decoder_layers": 0, "num_heads": 2, "head_dim": 8, "mlp_dim": 32, "max_len": 512,
    "type_vocab_size": 2, "dropout_rate": 0.1, "attention_dropout_rate": 0.1, "activation": "gelu",
    "layer_norm_eps": 1e-12, "norm": "post", "positions": "learned", "initializer": "truncated_normal",
    "initializer_range": 0.02, "share_embeddings": True, "tie_output": True, "scale_embeddings": False,
    "use_pooler": True, "num_labels": 2, "scan_layers": False, "remat_policy": "none",
    "attention_kernel": "xla"}
SMALL = dict(vocab_size=100, emb_dim=16, num_layers=1, num_heads=2, head_dim=8, mlp_dim=32)
# configs/multi30k.py (a transformer), a decoder_lm built from the Transformer base preset, and
# a `bert-jax convert` output of a multiple-choice head (use_pooler and num_labels=1 written
# for every head), at SMALL sizes.
OLD_SECTIONS = {
    "transformer": {
        "activation": "relu", "attention_dropout_rate": 0.1, "attention_kernel": "xla",
        "dropout_rate": 0.1, "emb_dim": 256, "head_dim": 64, "initializer": "xavier_uniform",
        "initializer_range": 0.02, "layer_norm_eps": 1e-06, "max_len": 512, "mlp_dim": 1024,
        "name": "transformer", "norm": "pre", "num_decoder_layers": 3, "num_heads": 4,
        "num_labels": 2, "num_layers": 3, "positions": "sinusoidal", "remat_policy": "none",
        "scale_embeddings": True, "scan_layers": False, "share_embeddings": True, "tie_output": True,
        "type_vocab_size": 0, "use_pooler": False, "vocab_size": 8000},
    "decoder_lm": {
        "name": "decoder_lm", "vocab_size": 50, "emb_dim": 512, "num_layers": 6,
        "num_decoder_layers": 6, "num_heads": 8, "head_dim": 64, "mlp_dim": 2048, "max_len": 512,
        "type_vocab_size": 0, "dropout_rate": 0.1, "attention_dropout_rate": 0.1,
        "activation": "relu", "layer_norm_eps": 1e-06, "norm": "post", "positions": "sinusoidal",
        "initializer": "xavier_uniform", "initializer_range": 0.02, "share_embeddings": True,
        "tie_output": True, "scale_embeddings": True, "use_pooler": False, "num_labels": 2,
        "scan_layers": False, "remat_policy": "none", "attention_kernel": "xla"},
    "bert_choice": {
        "name": "bert_choice", "vocab_size": 30522, "emb_dim": 768, "num_layers": 12,
        "num_heads": 12, "head_dim": 64, "mlp_dim": 3072, "max_len": 512, "type_vocab_size": 2,
        "dropout_rate": 0.1, "attention_dropout_rate": 0.1, "activation": "gelu",
        "layer_norm_eps": 1e-12, "initializer_range": 0.02, "use_pooler": True, "num_labels": 1},
    # A value the old code silently ignored: this BERT always had a learned position table.
    "bert_pretraining": {**OLD_BERT_PRETRAINING, "positions": "sinusoidal", "num_decoder_layers": 4},
}
OLD_RUN = ["--config.data.name=synthetic", "--config.train.batch_size=8",
           "--config.model.num_layers=1", "--config.model.emb_dim=16", "--config.model.num_heads=2",
           "--config.model.head_dim=8", "--config.model.mlp_dim=32", "--config.model.vocab_size=100",
           "--config.data.max_seq_length=16", "--config.train.eval_steps=1",
           "--config.schedule.warmup_steps=1", "--config.train.checkpoint_every=2"]
PRETRAIN = ["train", "--config", "configs/bert_pretrain.py:tiny"]


@pytest.mark.parametrize("argv,field,model", [
    (PRETRAIN + ["--config.model.tie_output=false"], "model.tie_output", "bert_pretraining"),
    (PRETRAIN + ["--config.model.num_labels=3"], "model.num_labels", "bert_pretraining"),
    (["train", "--config", "configs/squad.py:v1,tiny", "--config.model.use_pooler=false"],
     "model.use_pooler", "bert_span"),
    (["train", "--config", "configs/multi30k.py", "--config.model.type_vocab_size=2"],
     "model.type_vocab_size", "transformer"),
], ids=["tie-output-on-bert", "num-labels-on-pretraining", "pooler-on-span", "segments-on-transformer"])
def test_a_field_the_model_does_not_read_is_an_error(cli, tmp_path, argv, field, model):
    code, out, err = cli(argv + ["--workdir", str(tmp_path / "w"), "--config.data.name=synthetic"])
    assert code != 0
    assert field in err and repr(model) in err and "remove it" in err, err
    assert not (tmp_path / "w" / "checkpoints").exists()  # stopped before anything ran


def test_a_config_file_with_a_field_its_model_does_not_read_is_refused(cli, tmp_path):
    (tmp_path / "c.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('p', {str(REPO / 'configs/bert_pretrain.py')!r})\n"
        "p = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(p)\n\n\n"
        "def get_config(arg=None):\n    c = p.get_config('tiny')\n"
        "    c.model.tie_output = False\n    return c\n")
    code, _, err = cli(["info", "--config", str(tmp_path / "c.py")])
    assert code == 1 and "model.tie_output=False" in err and "'bert_pretraining'" in err, err
    with pytest.raises(config_lib.ConfigError, match="model.tie_output.*'bert_pretraining'"):
        config_lib.validate(config_lib.load(str(tmp_path / "c.py")), 8)


def test_each_model_section_holds_the_fields_its_model_reads():
    for name in models.MODELS:
        preset = (models.transformer_model_fields("base") if name in ("transformer", "decoder_lm")
                  else models.bert_model_fields("tiny"))
        section = models.model_section(name, preset)
        assert set(section) == {"name", *models.model_fields(name)} - {"dtype"}, name
        models.split_model_config(section)  # accepted as it is
    assert "tie_output" not in models.model_fields("bert")
    assert "num_labels" in models.model_fields("bert_tagging")
    assert "num_labels" not in models.model_fields("bert_span")
    assert "share_embeddings" not in models.model_fields("decoder_lm")


def test_checkpoint_field_lists_come_from_the_field_metadata():
    kinds = {f.name: f.metadata["kind"] for c in FAMILIES for f in dataclasses.fields(c)}
    assert set(kinds.values()) == {"architecture", "state", "run"}  # every field has a kind
    assert set(checkpoint.ARCHITECTURE_FIELDS) == {k for k, v in kinds.items() if v == "architecture"}
    assert set(checkpoint.STATE_FIELDS) == {"name"} | {k for k, v in kinds.items() if v != "run"}
    # what the lists held when they were kept by hand
    assert set(checkpoint.ARCHITECTURE_FIELDS) == {
        "vocab_size", "emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim", "max_len",
        "type_vocab_size", "activation", "norm", "positions",
        "position_offset",  # (and since: RoBERTa's first position row, the modern encoder's switches)
        "normalization", "norm_bias", "use_bias", "mlp_layer", "rope_theta", "rope_local_theta",
        "embedding_norm", "vocab_multiple", "task_head",
        "hf_family"}  # (and the Hugging Face family its checkpoints are, declared)
    assert set(checkpoint.STATE_FIELDS) - set(checkpoint.ARCHITECTURE_FIELDS) == {
        "name", "num_decoder_layers", "use_pooler", "num_labels", "share_embeddings", "tie_output",
        "scale_embeddings", "attention_window", "attention_global_every", "attention_pattern",
        "bigbird_block", "bigbird_window_blocks", "bigbird_global_blocks", "bigbird_random_blocks",
        "linformer_k",  # (and since: the local window and the patterns, what they compute)
        "pooling", "nsp",  # (and whether pretraining has the NSP head and its pooler)
        "embedding_pooling", "normalize_embeddings", "learn_scale"}  # (and sentence embeddings)


def _changed(value, meta):
    if meta["choices"]:
        return next(c for c in meta["choices"] if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, tuple):  # matryoshka_dims
        return (1,)
    return value + 7 if isinstance(value, int) else value / 2  # +7: vocab_multiple 8 pads 30522


def test_the_flops_count_reads_exactly_the_fields_marked_flops():
    """A field marked flops=True changes some model's FLOPs count; any other field changes none
    (so a new field that changes the compute cannot be forgotten by the count)."""
    moved = set()
    # each attention pattern's fields count only under that pattern
    patterns = [{}, {"attention_window": 16}, {"attention_window": 16, "attention_global_every": 3},
                {"attention_pattern": "bigbird"}, {"attention_pattern": "linformer"}]
    for name, pattern in itertools.product(models.MODELS, patterns):
        preset = (models.transformer_model_fields("base") if name in ("transformer", "decoder_lm")
                  else models.bert_model_fields("base"))
        try:
            section = models.model_section(name, preset, **pattern)
            base = models.flops_per_token(section, 512)
        except ValueError:  # linformer is for the BERT models
            continue
        for f in dataclasses.fields(models.CONFIGS[name]):
            if f.name in section and f.name != "attention_kernel":
                changed = dict(section, **{f.name: _changed(section[f.name], f.metadata)})
                try:
                    if models.flops_per_token(changed, 512) != base:
                        moved.add(f.name)
                except ValueError:  # a combination the patterns refuse
                    pass
    marked = {f.name for c in FAMILIES for f in dataclasses.fields(c) if f.metadata["flops"]}
    assert moved == marked


@pytest.mark.parametrize("name", sorted(OLD_SECTIONS))
def test_old_stored_configs_load(tmp_path, name):
    """A checkpoint whose stored model section holds every model's fields (as saved before the
    per-family configs) loads: the fields its model never read are left out."""
    old = {**OLD_SECTIONS[name], **SMALL}
    expected = models.complete_model_config(models.stored_model_config(old))
    model = models.create_model(expected)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    checkpoint.save_params(tmp_path, 0, params, {"model": old})
    stored = checkpoint.read_config(tmp_path)["model"]
    assert set(stored) <= {"name", *models.model_fields(name)}
    # nothing else changed (a BERT model's family, which it did not say then, is added)
    assert {k: old[k] for k in stored if k != "hf_family"} == {k: v for k, v in stored.items()
                                                               if k != "hf_family"}
    assert stored.get("hf_family", "bert") == "bert"
    model_cfg, loaded = state.load_model(tmp_path)
    assert jax.tree.map(lambda x: x.shape, nnx.to_pure_dict(nnx.state(loaded, nnx.Param))) \
        == jax.tree.map(lambda x: x.shape, params)
    if name == "transformer":
        assert translate._run_spec(str(tmp_path)).model_name == "transformer"
    if name == "bert_pretraining":  # its encoder initialises a fine-tuning run (init_from)
        config = config_lib.load(str(REPO / "configs/glue.py:sst2,tiny"), [f"init_from={tmp_path}"])
        config = state.sizes_from_init(config)
        # (the old config's positions: BERT read none then, its table is learned)
        assert config.model.emb_dim == 16 and config.model.positions == "learned"
        spec = config_lib.resolve(config)
        mesh = sharding.make_mesh(spec.mesh)
        _, abstract, state_sh = state.abstract_state(spec, mesh)
        found = state.pretrained(spec, state.with_shardings(abstract["params"],
                                                            state_sh["params"]), mesh)
        assert "embeddings" in found["bert"]


# BERT model sections as the code before model.hf_family (the start of issue 31) stored them, at
# SMALL sizes: a configs/bert_pretrain.py run, a `bert-jax convert` of a RoBERTa (pad id 1), a
# configs/modernbert.py run. Nothing in them says the family: export guessed it from the fields.
_BEFORE_HF_FAMILY = {
    "name": "bert_pretraining", **SMALL, "max_len": 512, "activation": "gelu", "norm": "post",
    "normalization": "layernorm", "norm_bias": True, "use_bias": True, "mlp_layer": "mlp",
    "positions": "learned", "rope_theta": 10000.0, "rope_local_theta": 0.0, "dropout_rate": 0.1,
    "attention_dropout_rate": 0.1, "layer_norm_eps": 1e-12, "initializer": "truncated_normal",
    "initializer_range": 0.02, "scan_layers": False, "remat_policy": "none",
    "attention_kernel": "xla", "attention_block_size": 128, "attention_window": 0,
    "attention_global_every": 0, "attention_pattern": "full", "bigbird_block": 64,
    "bigbird_window_blocks": 1, "bigbird_global_blocks": 1, "bigbird_random_blocks": 3,
    "type_vocab_size": 2, "embedding_norm": True, "vocab_multiple": 1, "task_head": "bert",
    "linformer_k": 256, "position_offset": 0, "nsp": True}
SAVED_BEFORE_HF_FAMILY = {
    "bert": _BEFORE_HF_FAMILY,
    "roberta": {**_BEFORE_HF_FAMILY, "max_len": 66, "layer_norm_eps": 1e-05, "type_vocab_size": 1,
                "position_offset": 2, "nsp": False},
    "modernbert": {**_BEFORE_HF_FAMILY, "max_len": 8192, "norm": "pre", "norm_bias": False,
                   "use_bias": False, "mlp_layer": "glu", "positions": "rope", "rope_theta": 160000.0,
                   "rope_local_theta": 10000.0, "dropout_rate": 0.0, "attention_dropout_rate": 0.0,
                   "layer_norm_eps": 1e-05, "attention_window": 64, "attention_global_every": 3,
                   "type_vocab_size": 0, "vocab_multiple": 64, "task_head": "modernbert", "nsp": False},
}


@pytest.mark.parametrize("family", sorted(SAVED_BEFORE_HF_FAMILY))
def test_configs_saved_before_hf_family_load_as_their_family(tmp_path, family):
    """A checkpoint whose model section does not declare its family reads as the family export
    took it for (inferred once, where stored configs are read), and exports as that family."""
    from bert_jax.interop import convert

    old = SAVED_BEFORE_HF_FAMILY[family]
    assert "hf_family" not in old
    model = models.create_model(old)
    checkpoint.save_params(tmp_path, 0, nnx.to_pure_dict(nnx.state(model, nnx.Param)), {"model": old})
    stored = checkpoint.read_config(tmp_path)["model"]
    assert stored == {**old, "hf_family": family}  # only the family added
    model_cfg, _ = state.load_model(tmp_path)
    assert model_cfg["hf_family"] == family
    ids = {"pad": 1, "cls": 0, "sep": 2}
    assert convert.hf_config(model_cfg, ids)["model_type"] == family
    # A section that declares a family keeps it, whatever the other fields are.
    assert models.stored_model_config({**old, "hf_family": "bert"})["hf_family"] == "bert"


def test_the_hf_family_choices_are_the_registered_families():
    """model.hf_family takes the names of the families interop/families registers, no other."""
    from bert_jax.interop import families

    assert set(HF_FAMILIES) == set(families.Family.known)
    assert {f.name: f.model_type for f in families.Family.known.values()} == {
        "bert": "bert", "roberta": "roberta", "modernbert": "modernbert"}
    assert models.modernbert_model_fields("tiny")["hf_family"] == "modernbert"
    assert models.bert_model_fields("tiny")["hf_family"] == "bert"


@pytest.mark.slow  # trains, evaluates, exports and averages a run
def test_a_checkpoint_saved_before_per_family_configs_resumes_evaluates_and_exports(cli, tmp_path):
    work = tmp_path / "w"
    code, out, err = cli(PRETRAIN + OLD_RUN + ["--config.train.steps=2", "--workdir", str(work)])
    assert code == 0, err[-2000:]
    trained = json.loads(out.strip().splitlines()[-1])
    # Its stored config as the code before the per-family configs wrote it.
    path = work / "checkpoints" / "2" / "config" / "metadata"
    stored = json.loads(path.read_text())
    # Fields added since (attention kernel and patterns, position_offset) are not in the old one.
    assert ({k: v for k, v in stored["model"].items() if k in OLD_BERT_PRETRAINING}
            == {k: v for k, v in OLD_BERT_PRETRAINING.items() if k in stored["model"]})
    path.write_text(json.dumps({**stored, "model": OLD_BERT_PRETRAINING}))
    (work / "checkpoints" / "2" / "checksums.json").unlink()  # nor had checkpoints checksums then

    code, out, err = cli(["eval", "--workdir", str(work)])  # with its stored config
    assert code == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["eval/loss"] == trained["eval"]["eval/loss"]
    code, out, err = cli(["export", str(work), f"hf:{tmp_path / 'hf'}"])
    assert code == 0 and (tmp_path / "hf" / "model.safetensors").is_file(), err[-2000:]
    code, out, err = cli(["average", "--workdir", str(work), "--last", "1", "--out", str(tmp_path / "avg")])
    assert code == 0, err[-2000:]
    code, out, err = cli(PRETRAIN + OLD_RUN + ["--config.train.steps=4", "--workdir", str(work)])
    assert code == 0 and "resumed from" in out + err, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["step"] == 4
