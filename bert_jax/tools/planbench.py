"""`bench longplan`: long sequences planned for TPU slices on this machine (docs/tpu.md, "Long
sequences: 16k and 32k tokens"): for each slice and length one `bert-jax plan` (train step only) of
a config, one sequence per device, bfloat16, layers scanned, splash attention in the
generation's tiles (or the config's), and per row whether it fits, memory per device, splash's
tiles, attention's share of the step's FLOPs (splash's visited tiles against the rest of the
model), the step time at the plan's MFU beside its roofline, and each uniform block size's tile
FLOPs. A row that does not fit is planned again with each `--remats` policy until one fits."""

from __future__ import annotations

import math
import time

from bert_jax import config as config_lib


def longplan_config(config: str, topology: str, length: int, overrides: list[str]):
    """`config` at `length` tokens (its masking rate predicted), one sequence per device of
    `topology`, bfloat16, scanned layers, splash, then `overrides`."""
    from bert_jax.cloud import tpu

    rate = config_lib.load(config).data.masked_lm_prob
    return config_lib.load(config, [
        f"model.max_len={length}", f"data.max_seq_length={length}",
        f"data.max_predictions_per_seq={math.ceil(rate * length)}", "data.phases=()",
        f"train.batch_size={tpu.parse(topology).devices}", "dtype=bfloat16",
        "model.scan_layers=true", "model.attention_kernel=splash", *overrides])


def attention_share(cfg, step: dict, devices: int) -> float | None:
    """Splash's visited-tile FLOPs over the step's: the model's FLOPs with its attention (the
    keys its pattern leaves, as the model counts them) replaced by the tiles'."""
    from bert_jax import models
    from bert_jax.models import attention

    if step["kernel_flops"] is None:
        return None
    _, model = models.split_model_config(config_lib.model_config(cfg))
    keys = attention.kernel("xla").flops(model, cfg.train.batch_size, cfg.data.max_seq_length,
                                         training=True)
    tiles = step["kernel_flops"] * devices
    return tiles / (step["flops"] - keys + tiles)


def bench_longplan(config: str, topologies: list[str], lengths: list[int], remats: list[str],
                   overrides: list[str]) -> dict:
    from bert_jax import models
    from bert_jax.cloud import plan, tpu

    # Every row's config (each slice, length and remat policy) checked before the first plan:
    # a policy is only tried where a row does not fit, minutes of compiling later.
    for topology in topologies:
        try:
            tpu.parse(topology)
        except ValueError as e:
            raise ValueError(f"--topologies: {e}") from None
        for length in lengths:
            for remat in ["none", *remats]:
                models.split_model_config(config_lib.model_config(longplan_config(
                    config, topology, length, [f"model.remat_policy={remat}", *overrides])))
    if not tpu.libtpu_installed():
        raise config_lib.MissingExtra("planning needs libtpu: pip install 'bert_jax[tpu]'")
    rows = []
    for topology in topologies:
        sl = tpu.parse(topology)
        for length in lengths:
            for remat in ["none", *remats]:
                cfg = longplan_config(config, topology, length,
                                      [f"model.remat_policy={remat}", *overrides])
                t0 = time.perf_counter()
                result = plan.plan(cfg, topology, evaluation=False)
                step = result["steps"][0]
                share = attention_share(cfg, step, sl.devices)
                rows.append({
                    "slice": topology, "tokens": length, "remat": remat, "fits": step["fits"],
                    "total_gib": _round(step["total"], 2**30), "hbm_gib": round(
                        sl.gen.hbm_per_device / 2**30, 2), "compiler_says": step["compiler_says"],
                    "blocks": step["blocks"], "model_tflop": round(step["flops"] / 1e12, 1),
                    "splash_tflop_per_device": _round(step["kernel_flops"], 1e12),
                    "attention_share": None if share is None else round(share, 3),
                    "step_s": round(step["step_time"], 3), "mfu": result["mfu"],
                    "roofline_s": round(step["roofline_s"], 3),
                    "block_choices": {c["block"]: round(c["kernel_flops"] / 1e12, 1)
                                      for c in step["block_choices"] or []},
                    "plan_s": round(time.perf_counter() - t0, 1)})
                if step["fits"]:
                    break
    return {"benchmark": f"{config} train step planned per slice and length (splash)",
            "rows": rows, "table": table(rows)}


def _round(x: float | None, unit: float) -> float | None:
    return None if x is None else round(x / unit, 2)


def table(rows: list[dict]) -> str:
    lines = ["| slice | tokens | remat | splash tiles | fits: total GiB per device (HBM) | model "
             "TFLOP/step | splash TFLOP per device | attention's share | step s at MFU / "
             "roofline s | tile TFLOP per device by block size |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fits = (f"{'yes' if r['fits'] else 'no'}: {r['total_gib']} ({r['hbm_gib']})"
                if r["total_gib"] is not None else
                f"no: \"{r['compiler_says']}\" ({r['hbm_gib']})")
        blocks = sorted(set((r["blocks"] or {}).values()))
        share = "-" if r["attention_share"] is None else f"{100 * r['attention_share']:.0f}%"
        choices = ", ".join(f"{b}: {f:,}" for b, f in r["block_choices"].items())
        lines.append(f"| {r['slice']} | {r['tokens']:,} | {r['remat']} | "
                     f"{'/'.join(map(str, blocks))} | {fits} | {r['model_tflop']:,} | "
                     f"{r['splash_tflop_per_device']:,} | {share} | {r['step_s']} at "
                     f"{100 * r['mfu']:.0f}% / {r['roofline_s']} | {choices} |")
    return "\n".join(lines)
