"""`bert-jax plan`: TPU slice names, and the real train and eval steps compiled for TPU
topologies on this CPU machine (libtpu), with memory per device and whether it fits."""

import contextlib
import io
import json
import re
import sys

import jax
import pytest
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.cloud import plan, tpu
from bert_jax.training import objectives, optim, sharding, state, train

CONFIG = str(REPO / "configs/bert_pretrain.py:tiny")
SMALL = ["model.vocab_size=128", "model.num_layers=1", "train.batch_size=32",
         "data.max_seq_length=16", "data.max_predictions_per_seq=3", "train.steps=100",
         "schedule.warmup_steps=10", "mesh.data=-1"]
needs_libtpu = pytest.mark.skipif(not tpu.libtpu_installed(), reason=(
    "libtpu is not installed (pip install 'bert_jax[tpu]'): the planner compiles with it"))


# Chips, JAX devices, torus shape and hosts of Cloud TPU slices as Google documents them
# (v2/v3: one device per TensorCore; v4/v5p: one per chip; v5e/v6e names count chips).
@pytest.mark.parametrize("name, chips, devices, shape, hosts", [
    ("v2-8", 4, 8, (2, 2), 1), ("v3-32", 16, 32, (4, 4), 4), ("v3-2048", 1024, 2048, (32, 32), 256),
    ("v4-8", 4, 4, (2, 2, 1), 1), ("v4-32", 16, 16, (2, 2, 4), 4), ("v4-4096", 2048, 2048, (8, 16, 16), 512),
    ("v5p-64", 32, 32, (2, 4, 4), 8), ("v5litepod-16", 16, 16, (4, 4), 4),
    ("v5litepod-8", 8, 8, (2, 4), 1), ("v6e-256", 256, 256, (16, 16), 64), ("V5E-1", 1, 1, (1, 1), 1)])
def test_slice_names_as_users_type_them(name, chips, devices, shape, hosts):
    s = tpu.parse(name)
    assert (s.chips, s.devices, s.shape, s.hosts) == (chips, devices, shape, hosts)


@pytest.mark.parametrize("name, says", [
    ("v4-6", "sizes: v4-8, v4-16, v4-32"), ("v3-16", "sizes: v3-8, v3-32, v3-64"),
    ("v3-4096", "v3-1024, v3-2048$"), ("v7-8", "unknown TPU generation"),
    ("tpu-v4", "expected a Cloud TPU name such as v3-32"), ("v5p-12", "no v5p slice of that size")])
def test_a_slice_that_does_not_exist_is_named_with_the_ones_that_do(name, says):
    with pytest.raises(ValueError, match=says):
        tpu.parse(name)


def small(*overrides):
    return config_lib.load(CONFIG, [*SMALL, *overrides])


def spec(*overrides):
    return config_lib.resolve(small(*overrides))


@pytest.fixture(scope="module")
def v4_plan():
    """`bert-jax plan --json` of small() on v4-8, in-process (as the `cli` fixture runs it): the
    JSON it prints, parsed. One compile for the tests of the plan's numbers and of its JSON."""
    from absl import app, flags

    from bert_jax import commands
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(app._run_init, "done", True)
        mp.setattr(sys, "argv", ["bert-jax", "plan", "--config", CONFIG,
                                 *(f"--config.{o}" for o in SMALL), "--topology", "v4-8", "--json"])
        try:
            commands.run()
        except SystemExit as e:  # absl's app.run exits, 0 when the plan fits
            assert not e.code, e.code
        finally:
            flags.FLAGS.unparse_flags()
            commands.options.LoadedConfig.reset()
    return json.loads(out.getvalue())


@needs_libtpu
@pytest.mark.slow
def test_plan_memory_per_device_matches_the_sharding_arithmetic(v4_plan):
    config = small()
    n_params = models.param_counts(models.abstract_model(config_lib.model_config(config)))["total"]
    train_step, eval_step = v4_plan["steps"]
    assert v4_plan["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1} and v4_plan["slice"]["devices"] == 4
    assert train_step["params"] == 4 * n_params  # f32, replicated over the data axis
    assert 2 * train_step["params"] <= train_step["opt_state"] <= 2 * train_step["params"] + 64  # Adam mu, nu
    # The compiler's total holds the arguments (state and batch) and the temporaries.
    assert train_step["total"] >= train_step["params"] + train_step["opt_state"] + train_step["temporaries"]
    assert train_step["fits"] and eval_step["fits"] and eval_step["opt_state"] == 0
    # Model FLOPs of a full batch: 3 x forward (training), every token and prediction slot.
    per = models.flops_per_token(config_lib.model_config(config), 16)
    want = 3 * (per["encoder_per_token"] * 32 * 16 + per["mlm_head_per_predicted_token"] * 32 * 3)
    assert train_step["flops"] == pytest.approx(want) and eval_step["flops"] == pytest.approx(want / 3)
    assert train_step["step_time"] == pytest.approx(want / (4 * 275e12 * 0.4))
    assert v4_plan["run_seconds"] == pytest.approx(100 * train_step["step_time"])
    # The roofline beside it: the FLOPs at the chips' peak, XLA's bytes at v4's 1,200 GB/s.
    assert train_step["roofline_s"] == pytest.approx(want / (4 * 275e12))
    assert train_step["memory_s"] == pytest.approx(train_step["bytes_accessed"] / 1200e9)
    assert train_step["bytes_accessed"] > train_step["params"] // 4  # reads the weights at least
    assert train_step["blocks"] is None  # the xla kernel has no tiles
    # Host input: ids, mask, segments (16 int32 each), 3 masked positions, ids (int32) and
    # weights (f32), the NSP label: 232 bytes an example; one host; a 1000-example window.
    assert v4_plan["host"] == {"example_bytes": 232, "batch_bytes": 232 * 32, "shuffle_window": 1000,
                               "shuffle_window_bytes": 232_000, "grain_workers": 0,
                               "features_in_memory": False}


@needs_libtpu
@pytest.mark.slow
def test_fsdp_shards_the_state_and_v3_counts_each_tensorcore(v4_plan):
    # the train steps only (evaluation=False): what is asserted needs no eval step compiled
    fsdp = plan.plan(small("mesh.data=1", "mesh.fsdp=4"), "v4-8", evaluation=False)["steps"][0]
    assert fsdp["params"] < v4_plan["steps"][0]["params"] / 3
    v3 = plan.plan(small(), "v3-8", evaluation=False)
    assert v3["mesh"]["data"] == 8 and v3["slice"]["hbm_per_device_gib"] < 16


@needs_libtpu
@pytest.mark.slow
def test_two_slices_split_the_data_axis_over_the_slices():
    result = plan.plan(small(), "v4-8", slices=2)
    assert result["slice"]["devices"] == 8 and result["mesh"]["data"] == 8 and result["fits"]


@needs_libtpu
@pytest.mark.slow
def test_an_oversized_batch_does_not_fit_in_the_compilers_words(cli):
    argv = ["plan", "--config", CONFIG, *(f"--config.{o}" for o in SMALL), "--topology", "v3-8",
            "--config.train.batch_size=65536", "--config.data.max_seq_length=512",
            "--config.data.max_predictions_per_seq=20"]
    code, out, err = cli(argv)
    assert code == 1, err
    assert "train phase 0 (512 tokens, batch 65536) on v3-8: does not fit:" in out
    assert "exceeds available HBM" in out and "NO" in out


def test_the_compilers_words_keep_their_numbers_whole():
    """No compile: libtpu 0.0.42.1's refusal as `plan` caught it (the oversized batch above);
    the sentence is kept from its start, the decimal point in 47.78G not taken for its end."""
    said = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
            "temporaries (47.78G) exceeds available HBM (15.48G).\nMore details...")
    assert plan._compiler_line(said) == (
        "Ran out of memory on HBM, the total memory required for HLO temporaries (47.78G) "
        "exceeds available HBM (15.48G)")
    assert plan._compiler_line("XLA:TPU compile permanent error. Program hbm requirement "
                               "72.20G exceeds available HBM (31.25G); details") == (
        "Program hbm requirement 72.20G exceeds available HBM (31.25G)")


@needs_libtpu
@pytest.mark.slow
def test_plan_json_for_scripts(v4_plan):
    assert v4_plan["fits"] and [s["name"] for s in v4_plan["steps"]] == ["train phase 0", "eval"]


def test_without_libtpu_plan_says_how_to_install_it(cli, monkeypatch):
    monkeypatch.setattr(tpu, "libtpu_installed", lambda: False)
    code, _, err = cli(["plan", "--config", CONFIG, "--topology", "v4-8"])
    assert code == 1 and "pip install 'bert_jax[tpu]'" in err


def test_activations_are_pinned_by_the_axis_rules_unless_turned_off():
    # On BERT-Base with fsdp=16 on v4-32 the compiler's own activation layout needs 18.2 GiB
    # per device, the pinned one 2.3 GiB (README); here: the constraints are in the program.
    found = {}
    for pinned in (True, False):
        cfg = small("mesh.data=1", "mesh.fsdp=8", f"shard_activations={pinned}")
        mesh = sharding.make_mesh(cfg.mesh)
        objective = objectives.for_config(cfg)
        tx, schedule = optim.make_optimizer(cfg)
        graphdef, abstract, state_sh = state.abstract_state(cfg, mesh, tx)
        step = train.jit_train_step(cfg, graphdef, objective, tx, schedule, mesh, state_sh)
        with jax.set_mesh(mesh):
            text = step.lower(state.with_shardings(abstract, state_sh),
                              train.batch_shapes(objective.batch_spec(cfg), mesh)).as_text()
        found[pinned] = re.findall(
            r"sharding_constraint \S+ <@mesh, \[([^\]]*)\]> : tensor<((?:\d+x)*\d+)x[a-z]", text)
    assert found[False] == []
    layouts = {shape: spec for spec, shape in found[True]}
    # [B, T, D] block outputs, [B, T, N, K] heads, [B, T, F] FFN: the batch over fsdp only
    assert layouts["32x16x128"] == '{"fsdp"}, {}, {}' and layouts["32x16x2x64"] == '{"fsdp"}, {}, {}, {}'
    assert layouts["32x16x512"] == '{"fsdp"}, {}, {}'


@needs_libtpu
@pytest.mark.slow
def test_plan_compiles_the_splash_kernel_for_the_tpu_and_it_needs_fewer_temporaries():
    """On a CPU machine, `plan` gets the real TPU kernel (the mesh's platform decides, not the
    default backend) and its temporaries: the dense [B, N, T, T] scores (2 heads x 3,072^2
    per device) are gone. The train step only (the eval step's kernel is the same).
    3,072 tokens: the shortest multiple of 512 at which the XLA kernel's step holds the scores
    (at 2,048 and 2,560 the TPU compiler's peak has none: its temporaries equal splash's),
    and each of the two compiles takes about half as long as at 4,096. In 128-token tiles (v5e's
    own 512 hold a little more: 6.5 MB, the margin is 5.4 MB)."""
    temps = {}
    for kernel in ("xla", "splash"):
        cfg = small("data.max_seq_length=3072", "data.max_predictions_per_seq=20",
                    "model.max_len=3072", "train.batch_size=8", "model.attention_dropout_rate=0.0",
                    f"model.attention_kernel={kernel}", "model.attention_block_size=128")
        result = plan.plan(cfg, "v5litepod-8", evaluation=False)
        assert result["config"]["attention_kernel"] == kernel
        temps[kernel] = result["steps"][0]["temporaries"]
    # the tiles set, and each block size's tile FLOPs: full attention visits every token pair
    # whatever the tiles, 18 B N T^2 K per layer (per device: 8 rows over 8 devices)
    step = result["steps"][0]
    assert set(step["blocks"].values()) == {128}
    assert [c["block"] for c in step["block_choices"]] == [128, 256, 512, 1024]
    assert {c["kernel_flops"] for c in step["block_choices"]} == {18 * 2 * 3072**2 * 64}
    assert "splash tiles 128; TFLOP per device its tiles visit, by block size: 128: " in (
        plan.format_plan(result))
    assert temps["splash"] + 2 * 3072**2 * 4 <= temps["xla"], temps  # at least one [N, T, T] float32


def test_plan_counts_splash_flops_that_the_compiler_cannot_see():
    """No compile: the splash kernel's FLOPs of a step, from its visited tiles (a 1-layer model,
    2 heads of 64, 32 rows of 512 tokens in tiles of 128: 16 tiles; a window of 100 visits the
    diagonal and its neighbours, 10), 9 matmuls a tile training, 2 in evaluation; xla: none."""
    tile = 9 * 2 * 128 * 128 * 64 * 2 * 32
    splash = ["data.max_seq_length=512", "model.attention_kernel=splash",
              "model.attention_dropout_rate=0"]
    assert plan.kernel_flops(spec(), training=True) is None
    assert plan.kernel_flops(spec(*splash), training=True) == 16 * tile
    windowed = spec(*splash, "model.attention_window=100")
    assert plan.kernel_flops(windowed, training=True) == 10 * tile
    assert plan.kernel_flops(windowed, training=False) == 10 * tile * 2 / 9
    # the generation's tiles when the config leaves them to it (model.attention_block_size=0)
    for kind, block in (("TPU v5 lite", 512), ("TPU v5", 512), ("TPU v3", 128)):  # v5p: 1,024 > 512
        blocks, choices = plan.kernel_blocks(spec(*splash), kind, training=True, devices=4)
        assert set(blocks.values()) == {block}
        assert [(c["block"], c["smem_fits"]) for c in choices] == [
            (128, True), (256, True), (512, True)]  # 1,024 does not tile 512 tokens


def test_the_time_at_an_mfu_is_shown_beside_the_roofline():
    step = {"step_time": 2.5, "roofline_s": 1.0, "memory_s": 0.25, "bytes_accessed": 2**31}
    result = {"mfu": 0.4, "hbm_bandwidth_per_chip": 819e9}
    assert plan._roofline(step, result) == (
        "step 2.5 s at 40% MFU; roofline: 1 s of FLOPs at peak, 0.25 s of memory traffic (2 GiB a "
        "device, XLA's count, at 819 GB/s a chip; custom kernels, and under model.scan_layers "
        "all but one layer, not counted)")
    assert plan._roofline({**step, "memory_s": None}, result) == (
        "step 2.5 s at 40% MFU; roofline: 1 s of FLOPs at peak")
    v3 = tpu.parse("v3-8").gen  # two devices a chip share its bandwidth and its peak
    assert (v3.bandwidth_per_device, v3.peak_per_device) == (450e9, 61.5e12)


@needs_libtpu
def test_plan_refuses_splash_mask_info_past_scalar_memory_before_compiling():
    """131,072 tokens in 128-token tiles: 3 MiB of mask info for a 1 MiB SMEM, refused in one
    line before anything compiles (v5e's own 512-token tiles would fit)."""
    cfg = small("data.max_seq_length=131072", "model.max_len=131072", "train.batch_size=8",
                "data.max_predictions_per_seq=20", "model.attention_dropout_rate=0.0",
                "model.attention_kernel=splash", "model.attention_block_size=128")
    with pytest.raises(config_lib.ConfigError, match=r"^model.attention_kernel=splash at 131,072 "
                       r"tokens in 128 x 128-token tiles: .* set model.attention_block_size=256"):
        plan.plan(cfg, "v5litepod-8", evaluation=False)


def test_plan_refuses_the_cudnn_kernel_for_a_tpu(cli):
    code, _, err = cli(["plan", "--config", CONFIG, *(f"--config.{o}" for o in SMALL), "--topology",
                        "v4-8", "--config.model.attention_kernel=cudnn", "--config.dtype=bfloat16",
                        "--config.model.attention_dropout_rate=0"])
    assert code == 1 and "model.attention_kernel=cudnn needs a GPU (cuDNN flash attention), not tpu" in err
