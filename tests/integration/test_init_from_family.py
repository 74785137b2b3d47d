"""init_from a checkpoint of another model family (a translation Transformer into a BERT
classifier) is refused naming both families and what each reads differently, where it used to
transplant the encoder's tensors that share names and train on with new embeddings, exit 0;
init_mode=transplant is the named opt-in to that partial start."""

import pytest
from flax import nnx
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.config import ConfigError
from bert_jax.training import checkpoint, sharding, state

TINY = dict(vocab_size=64, emb_dim=16, num_layers=1, num_decoder_layers=1, num_heads=2, head_dim=8,
            mlp_dim=32, max_len=32)
BERT_TINY = [f"model.{k}={v}" for k, v in TINY.items() if k != "num_decoder_layers"]


@pytest.fixture(scope="module")
def translation_checkpoint(tmp_path_factory):
    source = models.model_section("transformer", {**models.transformer_model_fields("base"), **TINY})
    params = nnx.to_pure_dict(nnx.state(models.create_model(source), nnx.Param))
    folder = tmp_path_factory.mktemp("mt")
    checkpoint.save_params(folder, 0, params, {"model": source})
    return folder


def test_init_from_another_family_is_refused_naming_what_differs(cli, tmp_path, wordpiece_vocab,
                                                                 translation_checkpoint):
    code, _, err = cli(["train", "--config", "configs/glue.py:mrpc,tiny", "--workdir",
                        str(tmp_path / "run"), f"--config.init_from={translation_checkpoint}",
                        f"--config.data.tokenizer={wordpiece_vocab.parent}",
                        "--config.data.data_dir=/nonexistent"])
    assert code == 1, err
    assert "holds a 'transformer' model (encoder-decoder family)" in err and "(BERT family)" in err, err
    for differs in ("model.positions: 'sinusoidal' in the checkpoint, 'learned' here",
                    "model.scale_embeddings: True in the checkpoint, none here",
                    "model.type_vocab_size: none in the checkpoint, 2 here",
                    "model.embedding_norm: none in the checkpoint, True here",
                    "pass --config.init_mode=transplant to take only its tensors whose names and "
                    "shapes match"):
        assert differs in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def pretrained(config):
    mesh = sharding.make_mesh(config.mesh)
    _, abstract, state_sh = state.abstract_state(config, mesh)
    return state.pretrained(config, state.with_shardings(abstract["params"], state_sh["params"]), mesh)


def test_transplant_takes_the_tensors_that_fit_and_names_the_rest(translation_checkpoint, caplog):
    glue = str(REPO / "configs/glue.py:mrpc,tiny")
    config = config_lib.load(glue, [f"init_from={translation_checkpoint}", "init_mode=transplant",
                                    *BERT_TINY])
    assert state.sizes_from_init(config) is config  # the config's model, as written
    with caplog.at_level("INFO", logger="bert_jax"):
        found = pretrained(config)
    # The encoder's layers fit by name and shape; embeddings, pooler and classifier start fresh.
    assert set(found["bert"]) == {"encoder"} and "attention" in found["bert"]["encoder"]["layers"]
    [said] = [r.getMessage() for r in caplog.records if "transplanted" in r.getMessage()]
    assert "freshly initialised: bert/embeddings/norm/bias" in said and "not used: decoder/" in said
    # A tensor of our name but another shape stays fresh, and is listed unused with its shape.
    caplog.clear()
    with caplog.at_level("INFO", logger="bert_jax"):
        found = pretrained(config_lib.load(glue, [f"init_from={translation_checkpoint}",
                                                  "init_mode=transplant", *BERT_TINY, "model.mlp_dim=64"]))
    mlp = found["bert"]["encoder"]["layers"]["mlp"]  # wo's bias (emb_dim) fits, the kernels not
    assert set(mlp) == {"wo"} and set(mlp["wo"]) == {"bias"}, mlp
    [said] = [r.getMessage() for r in caplog.records if "transplanted" in r.getMessage()]
    assert "encoder/layers/mlp/wi/kernel (shape (1, 16, 32))" in said, said
    # Sizes that fit nothing: refused rather than a start from scratch under another name.
    wide = config_lib.load(glue, [f"init_from={translation_checkpoint}", "init_mode=transplant",
                                  *BERT_TINY, "model.emb_dim=32", "model.mlp_dim=64",
                                  "model.head_dim=16"])
    with pytest.raises(ConfigError, match="none of its tensors has a name and shape of this model's"):
        pretrained(wide)
    with pytest.raises(ConfigError, match="init_mode=transplant .* but init_from is empty"):
        state.sizes_from_init(config_lib.load(glue, ["init_mode=transplant"]))
