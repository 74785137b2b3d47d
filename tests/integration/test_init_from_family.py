"""init_from a checkpoint of another model family (a translation Transformer into a BERT
classifier) is refused naming both families, where it used to transplant the encoder's
tensors that share names and train on with new embeddings, exit 0."""

from bert_jax import models
from bert_jax.training import checkpoint

TINY = dict(vocab_size=64, emb_dim=16, num_layers=1, num_decoder_layers=1, num_heads=2, head_dim=8,
            mlp_dim=32, max_len=32)


def test_init_from_another_family_is_refused(cli, tmp_path, wordpiece_vocab):
    source = models.model_section("transformer", {**models.transformer_model_fields("base"), **TINY})
    from flax import nnx
    params = nnx.to_pure_dict(nnx.state(models.create_model(source), nnx.Param))
    checkpoint.save_params(tmp_path / "mt", 0, params, {"model": source})
    code, _, err = cli(["train", "--config", "configs/glue.py:mrpc,tiny", "--workdir",
                        str(tmp_path / "run"), f"--config.init_from={tmp_path / 'mt'}",
                        f"--config.data.tokenizer={wordpiece_vocab.parent}",
                        "--config.data.data_dir=/nonexistent"])
    assert code == 1, err
    assert "holds a 'transformer' model (encoder-decoder family)" in err and "(BERT family)" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()
