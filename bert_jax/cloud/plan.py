"""`bert-jax plan`: compile a run for a Cloud TPU slice before renting it.

The real train step (train.jit_train_step: the same function, state shardings, batch shapes
and microbatching as `train`) is compiled ahead of time for each sequence-length phase, and
the eval step once, on compile-only devices of the named slice (tpu.py; libtpu needed, no
TPU). Per device the compiler's memory analysis gives the total and the temporaries;
parameters and optimizer state come from the shardings. Model FLOPs per step come from the
model's objective on a full batch (every slot a real token), the projected time from the
chip's peak at a stated MFU, beside the roofline (those FLOPs at the peak, and XLA's bytes
accessed at the HBM bandwidth: chips.py); the compiler's own count (XLA's cost analysis) is shown beside
it, which leaves out custom kernels: splash attention's FLOPs are counted beside it from the
tiles its pattern visits (the kernel object's `flops`: models/kernels/splash.py; docs/attention.md).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Collection
from typing import Any

import jax
import numpy as np

from bert_jax import config as config_lib
from bert_jax import tasks
from bert_jax.cloud import tpu
from bert_jax.cloud.tpu import GiB
from bert_jax.models import attention
from bert_jax.models.kernels.splash import block_sizes, smem_error
from bert_jax.specs import RunSpec
from bert_jax.training import evaluate, setup, sharding, state, train


@dataclasses.dataclass
class Step:
    """One compiled step on the slice, per device."""

    name: str  # "train phase 0", "eval"
    seq_len: int
    batch: int
    microbatches: int
    params: int  # bytes
    opt_state: int  # bytes
    total: int | None  # the compiler's peak bytes (None: it did not fit)
    temporaries: int | None
    fits: bool
    compiler_says: str  # the compiler's message when it does not fit
    flops: float  # model FLOPs of one full global batch
    compiled_flops: float | None  # XLA's cost analysis, per device (custom kernels not counted)
    kernel_flops: float | None  # splash's, per device (evenly shared), from its visited tiles
    steps: int  # steps of the run in this phase (0 for eval)
    step_time: float  # seconds at the stated MFU
    compile_seconds: float
    roofline_s: float = 0.0  # the model FLOPs at the chips' peak (100% MFU)
    bytes_accessed: float | None = None  # XLA's cost analysis, per device (as compiled_flops)
    memory_s: float | None = None  # bytes_accessed at the chip's HBM bandwidth
    blocks: dict | None = None  # the kernel's tiles on this generation (splash's BlockSizes)
    block_choices: list | None = None  # per uniform block size: its tiles' FLOPs, SMEM fit


def plan(config, topology: str, slices: int = 1, mfu: float = 0.4, *,
         evaluation: bool = True, set_by_user: Collection[str] = (), read_init: bool = True
         ) -> dict[str, Any]:
    """The plan of `config` on `slices` x `topology`, as a JSON-ready dict (`evaluation=False`:
    the train steps only, one compile fewer); with config.init_from (unless not `read_init`: a
    dry run's gs:// one), of the model training will build: the checkpoint's sizes where the
    user (`set_by_user`: dotted keys) set none, and a size set to another value than the
    checkpoint's refused."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu={mfu}: a fraction of the chip's peak, in (0, 1]")
    config = config_lib.complete(config)
    if read_init:
        state.check_set_sizes(config, set_by_user)
        config = state.sizes_from_init(config, set_by_user)
    config = config_lib.resolve(config)
    config_lib.check_overrides_read(config, set_by_user)
    sl = tpu.parse(topology, slices)
    devices = tpu.compile_only_devices(sl)
    setup.check(config, platform="tpu", devices=len(devices), processes=sl.hosts, reads_data=False)
    # No data is read: a fine-tuning config's train.steps may come from its number of examples.
    is_task = config.data.finetuning
    steps_note = ""
    if config.train.steps == 0 and config.train.epochs > 0:
        steps_note = (f"train.steps comes from train.epochs={config.train.epochs} and the size of "
                      f"the training data, not read here: run time = steps x step time")
        config = dataclasses.replace(
            config, train=dataclasses.replace(config.train, steps=1),
            schedule=dataclasses.replace(config.schedule, warmup_fraction=0.0, warmup_steps=0))
    elif config.schedule.warmup_fraction:
        config = tasks.resolve_steps(config, None, set_by_user)
    engine = setup.build(config, sharding.make_mesh(config.mesh, devices))
    mesh, objective, abstract, state_sh = engine.mesh, engine.objective, engine.abstract, engine.state_sh
    params_bytes = sharding.bytes_per_device(abstract["params"], state_sh["params"])
    opt_bytes = sharding.bytes_per_device(abstract["opt_state"], state_sh["opt_state"])
    train_state = engine.train_state()
    peak = sl.chips * sl.gen.peak_per_chip * mfu
    kind = sl.gen.device_kinds[0]

    def compiled(name, fn, args, cfg: RunSpec, steps, state_bytes, extra=None):
        spec = {**objective.batch_spec(cfg), **(extra or {})}
        training = name != "eval"
        blocks, choices = kernel_blocks(cfg, kind, training=training, devices=len(devices))
        t0 = time.perf_counter()
        with jax.set_mesh(mesh):
            try:
                exe = fn.lower(*args, train.batch_shapes(spec, mesh)).compile()
                memory = exe.memory_analysis()
                total, temps, says = _total_bytes(memory), int(memory.temp_size_in_bytes), ""
                compiled_flops, accessed = _compiled_cost(exe, "flops"), _compiled_cost(
                    exe, "bytes accessed")
            except Exception as e:  # noqa: BLE001 (the compiler's own words are the answer)
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                total, temps, says = None, None, _compiler_line(str(e))
                compiled_flops = accessed = None
        # objective.flops counts a training step (forward + backward = 3 forwards)
        flops = float(objective.flops({k: np.ones(s.shape, s.dtype) for k, s in spec.items()}))
        flops = flops if training else flops / 3
        fits = total is not None and total <= sl.gen.hbm_per_device
        micro = cfg.train.grad_accum_steps if training else 1
        kernel = kernel_flops(cfg, training=training, device_kind=kind)
        return Step(name, cfg.data.max_seq_length, cfg.train.batch_size, micro, params_bytes,
                    state_bytes, total, temps, fits, says, flops, compiled_flops,
                    None if kernel is None else kernel / len(devices), steps, flops / peak,
                    time.perf_counter() - t0, flops / (peak / mfu), accessed,
                    None if accessed is None else accessed / sl.gen.bandwidth_per_device,
                    blocks, choices)

    steps = []
    for index, start in enumerate(_phase_starts(config)):
        _, cfg, end = config_lib.phase_config(config, start)
        step_fn = train.jit_train_step(cfg, engine.graphdef, objective, engine.tx, engine.schedule,
                                       mesh, state_sh)
        steps.append(compiled(f"train phase {index}", step_fn, (train_state,), cfg, end - start,
                              opt_bytes))
    # Evaluation: the params only, at the last phase's lengths; task eval batches also carry
    # which rows are padding.
    eval_cfg = config_lib.phase_config(config, _phase_starts(config)[-1])[1]
    eval_cfg = dataclasses.replace(  # evaluation keeps the run's batch
        eval_cfg, train=dataclasses.replace(eval_cfg.train, batch_size=config.train.batch_size))
    if evaluation:
        eval_fn = evaluate.jit_eval_step(config, engine.graphdef, objective, mesh, outputs=is_task)
        weight = {"example_weight": jax.ShapeDtypeStruct((config.train.batch_size,), np.float32)}
        steps.append(compiled("eval", eval_fn, (engine.params(),), eval_cfg, 0, 0,
                              weight if is_task else None))
    return {
        "host": _host_input(eval_cfg, objective, sl.hosts, is_task),
        "config": {"model": config.model_name, "dtype": config.dtype,
                   "attention_kernel": config.model.attention_kernel,
                   "layers": config.model.num_layers, "width": config.model.emb_dim,
                   "train_steps": config.train.steps},
        "slice": {"name": sl.label, "chips": sl.chips, "devices": sl.devices, "hosts": sl.hosts,
                  "shape": list(sl.shape), "slices": sl.slices,
                  "hbm_per_device_gib": round(sl.gen.hbm_per_device / GiB, 2),
                  "peak_tflops_per_chip": sl.gen.peak_per_chip / 1e12, "describe": sl.describe()},
        "mesh": dict(mesh.shape),
        "mfu": mfu,
        "hbm_bandwidth_per_chip": sl.gen.hbm_bandwidth,
        "steps": [dataclasses.asdict(s) for s in steps],
        "fits": all(s.fits for s in steps),
        "run_seconds": None if steps_note else sum(s.steps * s.step_time for s in steps),
        "note": steps_note,
    }


def kernel_blocks(config: RunSpec, device_kind: str, *, training: bool, devices: int
                  ) -> tuple[dict | None, list | None]:
    """For a kernel that reads model.attention_block_size: its tiles on a `device_kind` device
    at the config's length (a size it cannot fit refused here, before compiling: the kernel's
    `check_device`), and per uniform block size (128 to 1,024, those that tile the length) the
    FLOPs its tiles visit per device and whether its mask info fits; (None, None) otherwise."""
    cfg = config.model
    kernel = attention.kernel(cfg.attention_kernel)
    if not kernel.reads_block_size:
        return None, None
    length, causal = config.data.max_seq_length, cfg.family == "decoder-only"
    try:
        kernel.check_device(cfg, length, device_kind, causal=causal)
    except ValueError as e:
        raise config_lib.ConfigError(str(e)) from None
    blocks = {f: size for f, (_, size) in block_sizes(cfg, length, device_kind).items()}
    choices = []
    for block in (128, 256, 512, 1024):
        if block <= length and not length % block:
            uniform = dataclasses.replace(cfg, **{f"attention_{f}": block for f in blocks})
            choices.append({"block": block, "smem_fits": smem_error(
                                uniform, length, device_kind, causal=causal) is None,
                            "kernel_flops": kernel.flops(
                                uniform, config.train.batch_size, length, training=training,
                                causal=causal) / devices})
    return blocks, choices


def kernel_flops(config: RunSpec, *, training: bool, device_kind: str | None = None) -> float | None:
    """The FLOPs of a step's custom attention kernels, which XLA's cost analysis does not count
    (the kernel says: `opaque`, `flops`): each self-attention stack for the global batch
    (cross-attention runs with xla, so the compiler counts it). None for a kernel XLA counts."""
    cfg = config.model
    kernel = attention.kernel(cfg.attention_kernel)
    if not kernel.opaque:
        return None
    batch, length = config.train.batch_size, config.data.max_seq_length
    flops = kernel.flops(cfg, batch, length, causal=cfg.family == "decoder-only", training=training,
                         device_kind=device_kind)
    if cfg.family == "encoder-decoder":  # the decoder's causal self-attention too
        flops += kernel.flops(cfg, batch, length, causal=True, training=training,
                              layers=cfg.num_decoder_layers or cfg.num_layers,
                              device_kind=device_kind)
    return flops


def _host_input(cfg: RunSpec, objective, hosts: int, is_task: bool) -> dict[str, Any]:
    """What each host's input pipeline holds (longest phase): its share of a batch, the
    shuffle window (pretraining), and for fine-tuning the split's features (all in memory);
    `cfg` is the config of the longest phase."""
    spec = objective.batch_spec(cfg)  # packed fine-tuning: the most rows a batch can need
    batch = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in spec.values())
    example = batch // cfg.train.batch_size
    keys = cfg.data.keys  # (fine-tuning and translation rows have no shuffle window)
    window = 0 if is_task else getattr(keys, "shuffle_window", 0)
    return {"example_bytes": example, "batch_bytes": batch // hosts,
            "shuffle_window": window, "shuffle_window_bytes": example * window,
            "grain_workers": getattr(keys, "worker_count", 0),
            "features_in_memory": is_task}


def _phase_starts(config: RunSpec) -> list[int]:
    """First step of each sequence-length phase the run reaches."""
    starts = [p.start_step for p in config.phases] or [0]
    return [s for s in starts if s < config.train.steps] or [0]


def _total_bytes(memory) -> int:
    """Bytes per device the compiled program reserves: its arguments, the outputs not aliased
    to them (the donated state is) and its temporaries. (XLA's peak_memory_in_bytes reads lower
    than the temporaries alone on TPU; the compiler schedules to fit the HBM, so a program
    that compiles fits.)"""
    return int(memory.argument_size_in_bytes + memory.output_size_in_bytes
               - memory.alias_size_in_bytes + memory.temp_size_in_bytes)


def _compiled_cost(exe, key: str) -> float | None:
    """XLA's cost analysis per device ("flops", "bytes accessed"), None where the backend
    reports none. (Under scan_layers it counts the scanned layer once.)"""
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost[key]) if cost and key in cost else None


def _compiler_line(message: str) -> str:
    """The compiler's 'X exceeds available HBM (Y)' sentence, or its first line (a sentence
    ends at '.' or ':' before a space, so '47.78G' and 'XLA:TPU' stay whole)."""
    m = re.search(r"(?:[^.:\n]|[.:](?!\s))*exceeds[^\n]*?HBM \([^)]*\)", message)
    return (m.group(0) if m else message.splitlines()[0]).strip()[:300]


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min"


def _roofline(s: dict[str, Any], result: dict[str, Any]) -> str:
    """The step's time at the stated MFU beside its roofline: its model FLOPs at the chips'
    peak, and (where XLA counts bytes) its bytes accessed at the HBM bandwidth."""
    line = (f"step {s['step_time']:.3g} s at {100 * result['mfu']:.0f}% MFU; roofline: "
            f"{s['roofline_s']:.3g} s of FLOPs at peak")
    if s["memory_s"] is not None:
        line += (f", {s['memory_s']:.3g} s of memory traffic ({s['bytes_accessed'] / GiB:.3g} GiB "
                 f"a device, XLA's count, at {result['hbm_bandwidth_per_chip'] / 1e9:,.0f} GB/s "
                 f"a chip; custom kernels, and under model.scan_layers all but one layer, not counted)")
    return line


def _blocks_line(s: dict[str, Any]) -> str:
    """The kernel's tiles and, per uniform block size, the TFLOP its tiles visit per device."""
    sizes = sorted(set(s["blocks"].values()))
    tiles = (f"{sizes[0]}" if len(sizes) == 1 else
             ", ".join(f"{k} {v}" for k, v in s["blocks"].items()))
    choices = "; ".join(f"{c['block']}: {c['kernel_flops'] / 1e12:.3g}"
                        + ("" if c["smem_fits"] else " (mask info over SMEM)")
                        for c in s["block_choices"])
    return f"splash tiles {tiles}; TFLOP per device its tiles visit, by block size: {choices}"


def format_plan(result: dict[str, Any]) -> str:
    """The plan as a table per device and one summary line per step, for people."""
    sl, c = result["slice"], result["config"]
    hbm = sl["hbm_per_device_gib"]
    lines = [f"{c['model']} ({c['layers']} layers x {c['width']}, {c['dtype']}, attention "
             f"{c['attention_kernel']}) on {sl['describe']}",
             f"mesh {result['mesh']}; per device, GiB:", ""]
    head = (f"{'step':<14}{'tokens':>7}{'batch':>7}{'micro':>6}{'params':>8}{'opt':>8}{'temps':>8}"
            f"{'total':>8}{'HBM':>7}  {'fits':<5}{'TFLOP/step':>11}{'step s':>9}{'steps':>10}"
            f"{'time':>11}")
    lines.append(head)

    def gib(x):
        return "-" if x is None else f"{x / GiB:.2f}"

    for s in result["steps"]:
        run = _duration(s["steps"] * s["step_time"]) if s["steps"] and not result["note"] else "-"
        lines.append(f"{s['name']:<14}{s['seq_len']:>7}{s['batch']:>7}{s['microbatches']:>6}"
                     f"{gib(s['params']):>8}{gib(s['opt_state'] or None):>8}"
                     f"{gib(s['temporaries']):>8}{gib(s['total']):>8}{hbm:>7.2f}  "
                     f"{'yes' if s['fits'] else 'NO':<5}{s['flops'] / 1e12:>11.3g}"
                     f"{s['step_time']:>9.3g}{s['steps'] if s['steps'] and not result['note'] else '-':>10}"
                     f"{run:>11}")
    lines.append("")
    for s in result["steps"]:
        if s["total"] is None:
            verdict = f"does not fit: {s['compiler_says']}"
        else:
            verdict = (f"{s['total'] / GiB:.2f} GiB of {hbm:.2f} GiB per device, "
                       f"{'fits' if s['fits'] else 'does NOT fit'}")
            if s["compiled_flops"] is not None:
                verdict += (f"; the compiler counts {s['compiled_flops'] / 1e12:.3g} TFLOP per "
                            f"device (custom kernels such as splash not counted)")
            if s["kernel_flops"] is not None:
                verdict += (f"; splash's visited tiles add {s['kernel_flops'] / 1e12:.3g} TFLOP "
                            f"per device")
        lines.append(f"{s['name']} ({s['seq_len']} tokens, batch {s['batch']}) on {sl['name']}: "
                     f"{verdict}")
        lines.append(f"  {_roofline(s, result)}")
        if s["blocks"]:
            lines.append(f"  {_blocks_line(s)}")
    h = result["host"]
    kib = 1024
    line = (f"host input (each of {sl['hosts']}): {h['batch_bytes'] / kib:,.0f} KiB of batch, "
            f"{h['example_bytes']:,} bytes per example")
    if h["shuffle_window"]:
        line += (f"; shuffle window {h['shuffle_window']:,} examples = "
                 f"{h['shuffle_window_bytes'] / kib:,.0f} KiB")
    if h["grain_workers"]:
        line += f"; {h['grain_workers']} grain worker processes, each with its own buffers"
    if h["features_in_memory"]:
        line += "; fine-tuning: every feature of the split is held in memory (examples x that)"
    lines.append(line)
    at = (f"{100 * result['mfu']:.0f}% MFU ({sl['peak_tflops_per_chip']:.0f} bf16 TFLOP/s per "
          f"chip x {sl['chips']} chips; model FLOPs with every token slot used)")
    if result["note"]:
        lines.append(f"step times at {at}; {result['note']}")
    else:
        lines.append(f"{c['train_steps']:,} steps projected {_duration(result['run_seconds'])} at {at}")
        roofline = sum(s["steps"] * s["roofline_s"] for s in result["steps"])
        lines.append(f"at the roofline (100% MFU, the FLOPs alone) {_duration(roofline)}")
    return "\n".join(lines)
