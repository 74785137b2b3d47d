"""ModernBERT's full_megatron initialisation (its training code's bert_layers/initialization.py,
init_method full_megatron, init_cutoff_factor 2): each kernel a normal truncated at 2 stddev,
the stddev by the module's role: 0.02 for q/k/v, the MLP's input and the MLM head's dense;
0.02 / sqrt(2 x layers) for what adds to the residual stream (attention and MLP outputs) and the
task heads' dense; hidden^-0.5 for the classifiers; embeddings 0.02; biases 0. And the values
no initialisation or norm can work with are refused when the model config is made."""

import math
import re

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import models

# The standard deviation of a standard normal truncated at +-2 (the samples' stddev).
TRUNCATED = math.sqrt(1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(2 / math.sqrt(2)))


def kernels(name: str, **changes) -> dict[str, np.ndarray]:
    fields = {**models.modernbert_model_fields("base"), "vocab_size": 4096, "emb_dim": 256,
              "num_layers": 6, "num_heads": 4, "head_dim": 64, "mlp_dim": 512, "max_len": 64,
              **changes}
    labels = {"num_labels": 64} if name == "bert_classification" else {}
    model = models.create_model(models.model_section(name, fields, **labels), seed=0)
    flat = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(x)
            for path, x in jax.tree_util.tree_flatten_with_path(flat)[0]}


def expect(params: dict, suffix: str, std: float) -> None:
    x = params[suffix] if suffix in params else next(v for k, v in params.items() if k.endswith(suffix))
    assert np.abs(x).max() <= 2 * std * (1 + 1e-6), suffix  # cut at 2 stddev
    assert np.std(x) == pytest.approx(std * TRUNCATED, rel=0.03), suffix


def test_modernbert_initialises_by_role_as_its_training_code():
    hidden, layers = 256, 6
    out = 0.02 / math.sqrt(2.0 * layers)
    mlm = kernels("bert_pretraining")
    for suffix in ("attention/query/kernel", "attention/key/kernel", "attention/value/kernel",
                   "mlp/wi/kernel", "mlp/wi_gate/kernel", "mlm/transform/kernel",
                   "embeddings/word/embedding"):
        expect(mlm, suffix, 0.02)
    for suffix in ("attention/out/kernel", "mlp/wo/kernel"):
        expect(mlm, suffix, out)
    task = kernels("bert_classification")
    expect(task, "head/transform/kernel", out)  # FlexBertPoolingHead's dense: an out module
    expect(task, "classifier/kernel", hidden**-0.5)
    assert not np.any(task["classifier/bias"])


def test_the_bert_initialisation_is_unchanged():
    """truncated_normal (BERT's) keeps 0.02 everywhere, the residual outputs included."""
    bert = kernels("bert_classification", initializer="truncated_normal")
    for suffix in ("attention/out/kernel", "mlp/wo/kernel", "classifier/kernel"):
        expect(bert, suffix, 0.02)


@pytest.mark.parametrize("field, value, said", [
    ("rope_theta", float("nan"), "model.rope_theta=nan: a finite number is needed"),
    ("dropout_rate", float("inf"), "model.dropout_rate=inf: a finite number is needed"),
    ("layer_norm_eps", 0.0, "model.layer_norm_eps=0.0 must be > 0"),
    ("initializer_range", -0.02, "model.initializer_range=-0.02 must be > 0"),
])
def test_a_model_value_that_cannot_work_is_refused(field, value, said):
    """Refused when the model config is made (before anything compiles), not as a NaN loss."""
    with pytest.raises(ValueError, match=re.escape(said)):
        models.split_model_config(models.model_section(
            "bert", {**models.modernbert_model_fields("tiny"), field: value}))


@pytest.mark.parametrize("field, value, says", [
    ("layer_norm_eps", "small", "model.layer_norm_eps='small': expected a number"),
    ("num_layers", 2.0, "model.num_layers=2.0: expected an integer"),
    ("num_layers", True, "model.num_layers=True: expected an integer"),
    ("use_bias", 1, "model.use_bias=1: expected true or false"),
    ("activation", None, "model.activation=None: expected a string"),
])
def test_a_model_value_of_another_type_is_named(field, value, says):
    # (values read from a JSON file, such as convert's config.json, come with any type)
    with pytest.raises(ValueError) as e:
        models.BertConfig(**{field: value})
    assert str(e.value) == says
