"""init_mode=tile_from_middle against ModernBERT's code: the reference's tiling functions
(AnswerDotAI/ModernBERT, branch pretraining_documentation, src/bert_layers/initialization.py
`_tile_1d`, `_tile_2d`, `tile_fused_qkv`, `tile_fused_glu`, and model.py
`init_model_from_pretrained`, `init_mlm_model_from_pretrained`) transcribed here in numpy, loops
as published, applied to a small model's weights in the reference's fused layout (Wqkv
[3 x heads x head_dim, hidden], Wi [2 x ffn, hidden], torch's [out, in]); our tiled parameters,
mapped to that layout, must equal them. Then the refusals."""

import numpy as np
import pytest
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from bert_jax import models, trees
from bert_jax.config import ConfigError
from bert_jax.training import tiling

# 3 layers -> 6: the reference's map round(i * 3 / 6) = [0, 0, 1, 2, 2, 2] (1.5 -> 2, 2.5 -> 2:
# halves to even), so new layer 1 reads old layer 0, whose attention norm is an identity.
SMALL = dict(vocab_size=64, emb_dim=32, num_layers=3, num_heads=2, head_dim=16, mlp_dim=48)
LARGE = dict(SMALL, emb_dim=48, num_layers=6, num_heads=3, mlp_dim=80)


# ---- the reference, transcribed (torch.Tensor -> numpy; Linear weights are [out, in]) ----

def ref_tile_1d(pretrained, new_size):
    input_size = pretrained.shape[0]
    offset = (new_size - input_size) // 2
    result = np.zeros(new_size, pretrained.dtype)
    result[offset: offset + input_size] = pretrained
    for i in range(offset):
        result[offset - 1 - i] = pretrained[input_size - 1 - (i % input_size)]
    for i in range(offset + input_size, new_size):
        result[i] = pretrained[(i - offset) % input_size]
    return result


def ref_tile_2d(pretrained, new_shape):
    input_height, input_width = pretrained.shape
    new_height, new_width = new_shape
    height_offset = (new_height - input_height) // 2
    width_offset = (new_width - input_width) // 2
    horizontal_tiled = np.zeros((input_height, new_width), pretrained.dtype)
    horizontal_tiled[:, width_offset: width_offset + input_width] = pretrained
    for i in range(width_offset):
        horizontal_tiled[:, i] = horizontal_tiled[
            :, width_offset + input_width - 1 - (width_offset - i - 1) % input_width]
    for i in range(width_offset + input_width, new_width):
        horizontal_tiled[:, i] = horizontal_tiled[:, width_offset + (i - width_offset) % input_width]
    result = np.zeros((new_height, new_width), pretrained.dtype)
    result[height_offset: height_offset + input_height, :] = horizontal_tiled
    for i in range(height_offset):
        row_to_copy = (input_height - 1) - (i % input_height)
        result[height_offset - 1 - i, :] = horizontal_tiled[row_to_copy, :]
    for i in range(height_offset + input_height, new_height):
        row_to_copy = (i - height_offset) % input_height
        result[i, :] = horizontal_tiled[row_to_copy, :]
    return result


def ref_tile_weight(pretrained, new):
    return (ref_tile_1d(pretrained, new.shape[0]) if pretrained.ndim == 1
            else ref_tile_2d(pretrained, new.shape))


def ref_tile_fused(pretrained, new, chunks):  # tile_fused_qkv (3 chunks), tile_fused_glu (2)
    return np.concatenate([ref_tile_weight(p, n) for p, n in zip(
        np.split(pretrained, chunks), np.split(new, chunks), strict=True)])


def ref_init_mlm_model_from_pretrained(old, new):
    """The new model's weights (dict by reference name, fresh values where not tiled)."""
    out = dict(new)

    def tile(name, fused=1):
        if name in old:  # (a bias only where the layer has one; an identity norm has none)
            out[name] = ref_tile_fused(old[name], new[name], fused)
    embeddings = "embeddings.tok_embeddings.weight"
    assert old[embeddings].shape[0] == new[embeddings].shape[0]  # tile_embedding: the same vocabulary
    tile(embeddings)
    for suffix in ("weight", "bias"):
        tile(f"embeddings.norm.{suffix}")
    old_layers, new_layers = (sum(k.endswith("Wqkv.weight") for k in d) for d in (old, new))
    layer_mapping = [round(i * old_layers / new_layers) for i in range(new_layers)]
    for new_idx, old_idx in enumerate(layer_mapping):
        for name, fused in (("attn_norm", 1), ("attn.Wqkv", 3), ("attn.Wo", 1), ("mlp_norm", 1),
                            ("mlp.Wi", 2), ("mlp.Wo", 1)):
            for suffix in ("weight", "bias"):
                old_name, new_name = (f"encoder.layers.{i}.{name}.{suffix}" for i in (old_idx, new_idx))
                if old_name in old:
                    out[new_name] = ref_tile_fused(old[old_name], new[new_name], fused)
    for name in ("head.dense.weight", "head.dense.bias", "head.norm.weight", "head.norm.bias",
                 "decoder.bias"):  # tied decoder: bias_only; final_norm is not tiled
        tile(name)
    return out


# ---- our parameters in the reference's layout ----

def to_reference(params, cfg):
    """ModernBERT's names and layout of our bert_pretraining params."""
    flat = {"/".join(k): np.asarray(v) for k, v in flatten_dict(params).items()}
    enc = "bert/encoder/layers/"
    out = {"embeddings.tok_embeddings.weight": flat["bert/embeddings/word/embedding"],
           "final_norm.weight": flat["bert/encoder/final_norm/scale"],
           "head.dense.weight": flat["mlm/transform/kernel"].T, "head.norm.weight": flat["mlm/norm/scale"],
           "decoder.bias": flat["mlm/bias"], "embeddings.norm.weight": flat["bert/embeddings/norm/scale"]}
    for ours, theirs in (("bert/embeddings/norm/bias", "embeddings.norm.bias"),
                         ("mlm/transform/bias", "head.dense.bias"), ("mlm/norm/bias", "head.norm.bias"),
                         ("bert/encoder/final_norm/bias", "final_norm.bias")):
        if ours in flat:
            out[theirs] = flat[ours]
    d, n = cfg["emb_dim"], cfg["num_layers"]
    for i in range(n):  # a stacked leaf of fewer rows holds the last layers' (attention_norm)
        layer = {k[len(enc):]: v[i - n + len(v)] for k, v in flat.items()
                 if k.startswith(enc) and i - n + len(v) >= 0}
        p = f"encoder.layers.{i}."
        if i > 0:  # ModernBERT's layer 0 has no attention norm (an identity)
            out[p + "attn_norm.weight"] = layer["attention_norm/scale"]
        out[p + "attn.Wqkv.weight"] = np.concatenate(
            [layer[f"attention/{x}/kernel"].reshape(d, -1).T for x in ("query", "key", "value")])
        out[p + "attn.Wo.weight"] = layer["attention/out/kernel"].reshape(-1, d).T
        out[p + "mlp_norm.weight"] = layer["mlp_norm/scale"]
        out[p + "mlp.Wi.weight"] = np.concatenate([layer["mlp/wi/kernel"].T, layer["mlp/wi_gate/kernel"].T])
        out[p + "mlp.Wo.weight"] = layer["mlp/wo/kernel"].T
        if "attention/query/bias" in layer:
            if i > 0:
                out[p + "attn_norm.bias"] = layer["attention_norm/bias"]
            out[p + "attn.Wqkv.bias"] = np.concatenate(
                [layer[f"attention/{x}/bias"].reshape(-1) for x in ("query", "key", "value")])
            out[p + "attn.Wo.bias"] = layer["attention/out/bias"]
            out[p + "mlp_norm.bias"] = layer["mlp_norm/bias"]
            out[p + "mlp.Wi.bias"] = np.concatenate([layer["mlp/wi/bias"], layer["mlp/wi_gate/bias"]])
            out[p + "mlp.Wo.bias"] = layer["mlp/wo/bias"]
    return out


def section(sizes, **changes):
    return models.model_section("bert_pretraining", {**models.modernbert_model_fields("tiny"), **sizes},
                                **changes)


def fresh(cfg, seed=0):
    return nnx.to_pure_dict(nnx.state(models.create_model(cfg, seed=seed), nnx.Param))


@pytest.mark.parametrize("biases", [False, True])
def test_tiled_weights_equal_the_reference(biases):
    """Every tensor of a 6 x 48 ModernBERT tiled from a random 3 x 32 one (norms random too)
    equals the reference's tiling of the fused tensors; the final norm and the attention norm of
    the new layer read from the old layer 0 keep their fresh values; with biases (and norm
    biases) the fused biases too."""
    switches = dict(use_bias=biases, norm_bias=biases)
    small, large = section(SMALL, **switches), section(LARGE, **switches)
    rng = np.random.default_rng(0)
    source = unflatten_dict({k: rng.normal(size=np.shape(v)).astype(np.float32)
                             for k, v in flatten_dict(fresh(small)).items()})
    start = fresh(large, seed=1)  # the new model's own values, where nothing is tiled
    found, left, unused = tiling.tiled("src", small, source, large, start)
    assert set(left) == set(unused) == {"bert/encoder/final_norm/scale",
                                        *(["bert/encoder/final_norm/bias"] if biases else [])}
    ours = to_reference(trees.overlay(start, found), large)
    want = ref_init_mlm_model_from_pretrained(to_reference(source, small), to_reference(start, large))
    assert sorted(ours) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(ours[name], want[name], err_msg=name)
    # What the reference leaves: the new model's fresh values (LayerNorm: 1), not the old ones.
    np.testing.assert_array_equal(ours["encoder.layers.1.attn_norm.weight"], 1.0)
    np.testing.assert_array_equal(ours["final_norm.weight"], 1.0)
    assert not np.allclose(source["bert"]["encoder"]["final_norm"]["scale"], 1.0)


@pytest.mark.parametrize("change, message", [
    (dict(emb_dim=16), r"model\.emb_dim=16 is smaller than the checkpoint's 32.*set it >= 32"),
    (dict(num_layers=2), r"model\.num_layers=2 is smaller than the checkpoint's 3"),
    (dict(mlp_dim=40), r"model\.mlp_dim=40 is smaller"),
    (dict(num_heads=1), r"model\.num_heads x model\.head_dim=16 is smaller than the checkpoint's 32"),
    # round(7 * 3 / 8) = 3: past the last of 3 layers (the reference's IndexError)
    (dict(num_layers=8), r"model\.num_layers=8 maps its last layers past the checkpoint's 3.*"
                         r"at most 6 layers"),
    (dict(vocab_size=128), r"grows only the sizes .*model\.vocab_size: config 128, checkpoint 64; "
                           r"set --config\.model\.vocab_size=64"),
    (dict(norm="post"), r"model\.norm: config 'post', checkpoint 'pre'"),
])
def test_what_tiling_cannot_bridge_is_refused(change, message):
    theirs, ours = (models.complete_model_config(section(s)) for s in (SMALL, {**LARGE, **change}))
    with pytest.raises(ConfigError, match=message):
        tiling.check("src", theirs, ours)
    tiling.check("src", theirs, models.complete_model_config(section(LARGE)))  # the sizes only grow


def test_another_family_is_refused():
    theirs = models.complete_model_config(section(SMALL))
    lm = models.model_section("decoder_lm", models.transformer_model_fields("base"), vocab_size=64)
    with pytest.raises(ConfigError, match=r"holds a 'bert_pretraining' model \(BERT family\)"):
        tiling.check("src", theirs, models.complete_model_config(lm))


def test_modernbert_large_tiles_from_base():
    """The published pair: only the sizes differ, and the 28 layers read base's 22 by the
    reference's round(i * 22 / 28) (7 -> 5.5 -> 6 and 21 -> 16.5 -> 16: halves to even)."""
    base, large = (models.complete_model_config(models.model_section(
        "bert_pretraining", models.modernbert_model_fields(s))) for s in ("base", "large"))
    tiling.check("base", base, large)
    assert tiling.layer_map(28, 22) == [0, 1, 2, 2, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 12, 13, 13,
                                        14, 15, 16, 16, 17, 18, 19, 20, 20, 21]
    assert list(tiling.middle(1024, 768)[[0, 127, 128, 895, 896, 1023]]) == [640, 767, 0, 767, 0, 127]
    with pytest.raises(ConfigError, match="use at most 43 layers"):
        tiling.check("base", base, {**large, "num_layers": 44})


def test_stacked_leaves_with_and_without_layer_0s_attention_norm():
    """A new layer reads layer_map's old layer from a stacked leaf of all layers or of the last
    ones (a leaf may leave out layer 0's unused attention norm); an old layer without the tensor
    reads none (-1), whether its row is absent or present but unused (first=1)."""
    layers = tiling.layer_map(6, 3)  # [0, 0, 1, 2, 2, 2]
    assert list(tiling.stacked_rows(6, 3, layers, 3)) == [0, 0, 1, 2, 2, 2]
    assert list(tiling.stacked_rows(6, 3, layers, 3, first=1)) == [-1, -1, 1, 2, 2, 2]
    assert list(tiling.stacked_rows(5, 2, layers, 3)) == [-1, 0, 1, 1, 1]  # layers 1.. of each
    assert list(tiling.stacked_rows(5, 3, layers, 3, first=1)) == [-1, 1, 2, 2, 2]


def test_an_axis_tiling_does_not_grow_is_refused():
    """A classifier of 2 labels into one of 3: nothing to tile the labels from."""
    small, large = (models.model_section("bert_classification", {
        **models.modernbert_model_fields("tiny"), **sizes}, num_labels=n)
        for sizes, n in ((SMALL, 2), (LARGE, 3)))
    with pytest.raises(ConfigError, match=r"parameter classifier/bias has shape \(2,\) in the "
                                          r"checkpoint but \(3,\) here; tiling grows only"):
        tiling.tiled("src", small, fresh(small), large, fresh(large))
