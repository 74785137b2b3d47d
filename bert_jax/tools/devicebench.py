"""`python -m bert_jax.tools.bench device`: the GPU measurements, as one short run (about 8
minutes on one H100, most of it compiling; docs/speed.md#on-a-gpu).

Sections, each written to the JSON file as soon as it is measured (a run stopped at a time
limit keeps what it finished):
  machine    device kind, jax and cuDNN versions, the peak FLOP/s MFU is taken against.
  attention  one self-attention layer, forward and gradients with respect to q, k and v, bf16,
             12 heads of 64: the xla kernel against cuDNN flash attention on padded rows
             (`cudnn`, each row one sequence then padding) and on packed rows (several
             documents per row, segment ids: our cudnn kernel refuses them, so this row calls
             cuDNN's ragged layout directly, jax's private fused_attention_stablehlo API, as an
             experiment; `cudnn_ragged_any`: the same with room for a document per token, the
             bound a kernel that cannot know the packing ahead would pass), at 512, 1,024 and
             8,192 tokens per row; tokens/s and the largest
             difference from an f32 xla reference (output and each gradient, relative to the
             reference's largest value).
  train      the real train step (train.jit_train_step) of BERT-Base (MLM + NSP, unpacked
             full rows) with the xla and cudnn kernels, and of ModernBERT-base (MLM at 30%,
             packed documents; xla: cuDNN cannot take its bidirectional local windows) at 512
             and 1,024 tokens, bf16, attention dropout 0 (cuDNN refuses dropout; the same for
             both kernels); tokens/s and MFU (the objective's model FLOPs, training/metrics.py).
  embed      sentence vectors (models' encoder + pooling, as sentence_models.Encoder) of a
             BERT-Base-shaped bert_embedding model, texts/s at 128 and 512 tokens, bf16.
  variants   ModernBERT-base's step at 1,024 tokens with one change each (layers unrolled,
             AdamW, full rows, every layer global, and with cuDNN): where its time goes.
  peer       HF transformers' ModernBertForMaskedLM in PyTorch (sdpa, bf16 autocast, AdamW,
             sparse prediction) at the ModernBERT rows' shapes, where PyTorch is installed.

`--smoke` runs every section at miniature shapes in seconds, on any machine (the CPU test of
this tool); on a machine without a GPU the cuDNN rows say so instead of a number.
"""

from __future__ import annotations

import functools
import json
import math
import platform as platform_lib
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.interop import sentence_models
from bert_jax.models import kernels as kernel_registry
from bert_jax.models.masking import Masking
from bert_jax.paths import REPO
from bert_jax.tools import modelbench
from bert_jax.training import metrics as metrics_lib

# name -> (config, overrides): the full-size runs, and the miniatures of --smoke.
MODELS = {"bert-base": ("configs/bert_pretrain.py:base", ["model.attention_dropout_rate=0.0",
                                                          "model.max_len=1024"]),
          "modernbert-base": ("configs/modernbert.py:base", ["schedule.stages=()",
                                                             "model.scan_layers=true"])}
SMOKE_MODEL = ["model.num_layers=2", "model.emb_dim=64", "model.num_heads=4", "model.head_dim=16",
               "model.mlp_dim=128", "model.vocab_size=512"]
# tokens: a train step's tokens at the shortest length, rows * length**2 held at that length's
# (the attention arrays' size: 64 rows of 512, 16 of 1,024); attention_tokens: per call.
FULL = {"lengths": (512, 1024), "attention_lengths": (512, 1024, 8192), "tokens": 32768,
        "attention_tokens": 16384, "docs_per_row": 4, "steps": 10, "embed_texts": 8192}
SMOKE = {"lengths": (128,), "attention_lengths": (64, 128), "tokens": 256,
         "attention_tokens": 256, "docs_per_row": 2, "steps": 2, "embed_texts": 16}


def train_rows_at(plan: dict, length: int) -> int:
    """Rows of a train step at `length` tokens: a multiple of the devices (the batch's shards)."""
    rows = max(1, plan["tokens"] * plan["lengths"][0] // length ** 2)
    return -(-rows // jax.device_count()) * jax.device_count()


def has_gpu() -> bool:
    return jax.default_backend() == "gpu"


def no_gpu() -> str:
    """Why a cuDNN row has no number here."""
    return f"needs a GPU; this machine computes on {jax.default_backend()}"


def timed_step(config, plan: dict) -> dict:
    """`config`'s train step on one of its bench batches, timed (or the error it raised)."""
    batch = modelbench.pretraining_batch(config, plan["docs_per_row"])
    return guarded(lambda: modelbench.time_train_step(config, batch, plan["steps"], warmup=2))


def train_config(name: str, length: int, kernel: str, rows: int, smoke: bool,
                 extra: tuple[str, ...] = ()):
    """The run `name` at `length` tokens per row in bf16 (`extra`: more overrides)."""
    path, overrides = MODELS[name]
    rate = 0.3 if name.startswith("modernbert") else 0.15
    return config_lib.load(str(REPO / path), [
        *overrides, *(SMOKE_MODEL if smoke else []), "data.phases=()", "dtype=bfloat16",
        f"data.max_seq_length={length}", f"data.max_predictions_per_seq={round(rate * length)}",
        f"train.batch_size={rows}", f"model.attention_kernel={kernel}",
        "mesh.data=-1", "train.grad_accum_steps=1", *extra])


def train_rows(plan: dict, smoke: bool) -> list[dict]:
    rows = []
    for name in MODELS:
        for length in plan["lengths"]:
            for kernel in ("xla", "cudnn"):
                row = {"model": name, "tokens_per_row": length, "kernel": kernel,
                       "rows": train_rows_at(plan, length)}
                if kernel == "cudnn" and name.startswith("modernbert"):
                    row["skipped"] = ("cuDNN's masks cannot express bidirectional local windows "
                                      "(models/kernels/cudnn.py)")
                elif kernel == "cudnn" and not has_gpu():
                    row["skipped"] = no_gpu()
                else:
                    config = train_config(name, length, kernel, row["rows"], smoke)
                    row |= timed_step(config, plan)
                rows.append(_said(row))
    return rows


def _said(row: dict) -> dict:
    print(json.dumps(row), flush=True)  # the run's log: each row as it is measured
    return row


_GLOBAL = ("model.attention_window=0", "model.attention_global_every=0")
# Where ModernBERT-base's step time goes: the published run (first) against one change each.
VARIANTS = {"as published: layers scanned, StableAdamW, packed documents, local windows": (),
            "layers unrolled (model.scan_layers=false)": ("model.scan_layers=false",),
            "AdamW instead of StableAdamW": ("optimizer.name=adamw",),
            "full rows, no segment ids (data.instances=full_rows)": ("data.instances=full_rows",),
            "every layer global (model.attention_window=0)": _GLOBAL,
            "every layer global, full rows, cudnn": (*_GLOBAL, "data.instances=full_rows", "@cudnn")}


def variant_rows(plan: dict, smoke: bool, train: list[dict] = ()) -> list[dict]:
    """ModernBERT-base's train step at the longest length with each of VARIANTS; the one
    without changes is the train section's row at that length when this run measured it
    (`train`: the same step, so not compiled and timed twice)."""
    rows = []
    length = plan["lengths"][-1]
    same = [r for r in train if (r.get("model"), r["tokens_per_row"], r["kernel"]) == (
        "modernbert-base", length, "xla") and "tokens_per_s" in r]
    for label, changes in VARIANTS.items():
        kernel = "cudnn" if "@cudnn" in changes else "xla"
        row = {"variant": label, "tokens_per_row": length, "kernel": kernel,
               "rows": train_rows_at(plan, length)}
        if kernel == "cudnn" and not has_gpu():
            row["skipped"] = no_gpu()
        elif not changes and same:
            row |= {k: v for k, v in same[0].items() if k not in row and k != "model"}
            row["measured_in"] = "train"
        else:
            config = train_config("modernbert-base", length, kernel, row["rows"], smoke,
                                  tuple(c for c in changes if not c.startswith("@")))
            row |= timed_step(config, plan)
        rows.append(_said(row))
    return rows


def guarded(measure: Callable[[], dict]) -> dict:
    """A measurement, or the error it raised (one line, and the traceback's last frames), so
    one failing row does not cost the others."""
    try:
        return measure()
    except Exception as e:  # noqa: BLE001 -- recorded in the results, the run goes on
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "where": traceback.format_exc().splitlines()[-6:]}


def ragged_layout(segment_ids, max_segments: int):
    """cuDNN's ragged description of packed rows [B, T] (0: padding, runs of one id: a
    document) with at most M = max_segments documents each: [B, M + 1] offsets (each
    document's first token, -1 past the last) and [B, M] lengths (-1 past the last). A row of
    more than M documents would shift every later row's segments: the caller's bound must
    hold (M = T always does)."""
    def row(seg):
        before = jnp.concatenate([jnp.full((1,), -1, seg.dtype), seg[:-1]])
        after = jnp.concatenate([seg[1:], jnp.full((1,), -1, seg.dtype)])
        first = jnp.nonzero((seg != 0) & (seg != before), size=max_segments, fill_value=-1)[0]
        last = jnp.nonzero((seg != 0) & (seg != after), size=max_segments, fill_value=-1)[0]
        lengths = jnp.where(last >= 0, last + 1 - first, -1)
        offsets = jnp.concatenate([first, jnp.full((1,), -1, first.dtype)])
        return offsets.astype(jnp.int32), lengths.astype(jnp.int32)
    return jax.vmap(row)(segment_ids)


def ragged_cudnn(q, k, v, segment_ids, max_segments: int):
    """cuDNN flash attention over packed rows: each row's documents as cuDNN's ragged segments,
    through jax's private fused-attention API (an experiment: the cudnn kernel refuses packed
    rows)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

    offsets, lengths = ragged_layout(segment_ids, max_segments)
    return cudnn_fa.dot_product_attention(
        q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets, kv_offsets=offsets,
        scale=1 / math.sqrt(q.shape[-1]), mask_type=cudnn_fa.MaskType.PADDING)


def attention_fns(masking: Masking, segment_ids, docs: int) -> dict[str, Callable]:
    xla = kernel_registry.get("xla")
    fns = {"xla": lambda q, k, v: xla(q, k, v, masking)[0]}
    if has_gpu():
        cudnn = kernel_registry.get("cudnn")
        fns["cudnn"] = lambda q, k, v: cudnn(q, k, v, masking)[0]
        fns["cudnn_ragged"] = lambda q, k, v: ragged_cudnn(q, k, v, segment_ids, docs)
        # a bound that holds for any packing (a document per token at most): what a kernel
        # that cannot know the documents per row ahead would pass
        fns["cudnn_ragged_any"] = lambda q, k, v: ragged_cudnn(q, k, v, segment_ids,
                                                               segment_ids.shape[1])
    return fns


def attention_rows(plan: dict, heads: int = 12, head_dim: int = 64) -> list[dict]:
    """Each kernel's tokens/s (bf16, forward and gradients) and its largest difference from the
    xla kernel in f32, on padded rows (one sequence, its last quarter padding) and packed rows."""
    rows = []
    for length in plan["attention_lengths"]:
        B = max(1, plan["attention_tokens"] // length)
        q, k, v = (jax.random.normal(jax.random.key(i), (B, length, heads, head_dim), jnp.float32)
                   for i in range(3))
        pad = jnp.ones((B, length), jnp.int32).at[:, length * 3 // 4:].set(0)
        packed, positions = (jnp.asarray(x) for x in modelbench.packed_segments(
            B, length, plan["docs_per_row"], np.random.default_rng(length)))
        for layout, seg in (("padded", pad), ("packed", packed)):
            pos = positions if layout == "packed" else jnp.broadcast_to(jnp.arange(length), seg.shape)
            fns = attention_fns(Masking(seg, seg, pos, pos), seg, plan["docs_per_row"])
            reference = jax.jit(functools.partial(_forward_and_grads, fns["xla"]))(q, k, v)
            for name, fn in fns.items():
                if name.startswith("cudnn_ragged") != (layout == "packed") and name != "xla":
                    continue  # cudnn takes each row as one sequence; ragged is for packed rows
                row = {"layout": layout, "tokens_per_row": length, "rows": B, "kernel": name}
                row |= guarded(functools.partial(_time_attention, fn, (q, k, v), seg, reference,
                                                 plan["steps"]))
                rows.append(_said(row))
        if not has_gpu():
            rows.append({"tokens_per_row": length, "kernel": "cudnn",
                         "skipped": no_gpu()})
    return rows


def _forward_and_grads(fn, q, k, v):
    """fn's output and the gradients of a fixed projection of it (every output value counts)."""
    def loss(q, k, v):
        out = fn(q, k, v)
        weights = jnp.cos(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)
        return jnp.sum(out.astype(jnp.float32) * weights), out
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def _time_attention(fn, qkv, seg, reference, steps: int) -> dict:
    step = jax.jit(functools.partial(_forward_and_grads, fn))
    args = [x.astype(jnp.bfloat16) for x in qkv]
    t0 = time.perf_counter()
    out, grads = jax.block_until_ready(step(*args))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        result = step(*args)
    jax.block_until_ready(result)
    seconds = (time.perf_counter() - t0) / steps
    real = np.asarray(seg) != 0  # padding queries' outputs: no loss reads them
    errors = {"output": _relative(out, reference[0], real)}
    for name, got, want in zip("qkv", grads, reference[1], strict=True):
        errors[f"d{name}"] = _relative(got, want, real)
    B, T = seg.shape
    return {"tokens_per_s": round(B * T / seconds), "compile_s": round(compile_s, 2),
            "max_rel_error": errors}


def _relative(got, want, real) -> float:
    """max |got - want| over the real tokens, over max |want| there (3 significant digits)."""
    got, want = np.asarray(got, np.float32)[real], np.asarray(want, np.float32)[real]
    return float(f"{np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0):.3g}")


def embed_rows(plan: dict, smoke: bool) -> list[dict]:
    """Texts/s of sentence vectors (the encoder and pooling of sentence_models.Encoder) of a
    BERT-Base-shaped bert_embedding model, random weights, bf16, at 128 and 512 tokens."""
    rows = []
    for length in (128, 512) if not smoke else (32,):
        def measure(length=length):
            config = config_lib.load(str(REPO / "configs" / "embeddings.py"), [
                *(SMOKE_MODEL if smoke else []), "dtype=bfloat16"])
            model_cfg = config_lib.model_config(config)
            name = model_cfg["name"]
            encoder = functools.reduce(getattr, models.encoder_path(name), models.create_model(model_cfg))
            spec = sentence_models.SentenceSpec(max_seq_length=length)
            vectors, state = sentence_models.vector_fn(encoder, spec)
            n, batch = plan["embed_texts"], 256 if not smoke else 8
            rng = np.random.default_rng(0)
            ids = jnp.asarray(rng.integers(5, model_cfg["vocab_size"], (batch, length)), jnp.int32)
            args = (state, ids, jnp.zeros_like(ids), jnp.ones_like(ids))
            t0 = time.perf_counter()
            jax.block_until_ready(vectors(*args))
            compile_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(n // batch):
                out = vectors(*args)
            jax.block_until_ready(out)
            seconds = time.perf_counter() - t0
            return {"texts_per_s": round(n // batch * batch / seconds), "batch": batch,
                    "compile_s": round(compile_s, 2)}
        rows.append(_said({"tokens_per_text": length, **guarded(measure)}))
    return rows


def peer_rows(plan: dict, smoke: bool) -> list[dict]:
    """HF transformers' ModernBertForMaskedLM (modernbench.HFModernBert: PyTorch, sdpa
    attention, bf16 autocast, AdamW, logits at the masked positions only) at our ModernBERT
    rows' shapes, ids and masked positions; each row one sequence (its sdpa path has no segment
    ids), so it does the same matmuls as ours."""
    try:
        import torch  # noqa: F401 -- only whether it is here
        import transformers  # noqa: F401
    except ImportError as e:
        return [_said({"skipped": f"no PyTorch/transformers here ({e})"})]
    from bert_jax.tools.modernbench import HFModernBert

    rows = []
    for length in plan["lengths"]:
        def measure(length=length):
            config = train_config("modernbert-base", length, "xla", train_rows_at(plan, length), smoke)
            peer = HFModernBert(config, modelbench.pretraining_batch(config, plan["docs_per_row"]))
            peer.run(2)
            seconds = peer.run(plan["steps"]) / plan["steps"]
            return {"tokens_per_s": peer.tokens / seconds, "step_s": seconds, **peer.versions}
        rows.append(_said({"model": "HF ModernBertForMaskedLM (sdpa)", "tokens_per_row": length,
                           "rows": train_rows_at(plan, length), **guarded(measure)}))
    return rows


def machine() -> dict:
    device = jax.devices()[0]
    peak, source = metrics_lib.peak_flops_per_device()
    info = {"device": device.device_kind, "platform": device.platform, "devices": jax.device_count(),
            "jax": jax.__version__, "python": platform_lib.python_version(),
            "peak_flops": peak, "peak_source": source}
    import flax

    info["flax"] = flax.__version__
    try:  # (jax's own lookup; our first H100 runs' jax 0.11.2 had moved it)
        from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
        versions = cudnn_fa.cuda_versions
        info["cudnn"] = versions.cudnn_get_version() if has_gpu() and versions else None
    except Exception as e:  # noqa: BLE001 -- a version number is all this is for
        info["cudnn"] = f"unknown ({type(e).__name__}: {e})"[:200]
    return info


SECTIONS = ("attention", "train", "embed", "peer", "variants")


def run(out: Path, smoke: bool = False, sections: tuple[str, ...] = SECTIONS) -> dict:
    """Each of `sections` in turn, added to `out` (JSON; the sections an earlier run of the same
    plan wrote there are kept) after each; the markdown table beside it."""
    plan = SMOKE if smoke else FULL
    results: dict = {"machine": machine(), "plan": plan, "smoke": smoke}
    if out.exists():
        earlier = json.loads(out.read_text())
        same = ("device", "platform", "devices", "jax")
        if earlier.get("smoke") == smoke and all(earlier.get("machine", {}).get(k) == results[
                "machine"][k] for k in same):
            results = earlier | {"machine": results["machine"]}
    measured: dict = {}  # the sections this call measures (not those kept from an earlier run)
    makers = {"attention": lambda: attention_rows(plan), "train": lambda: train_rows(plan, smoke),
              "embed": lambda: embed_rows(plan, smoke), "peer": lambda: peer_rows(plan, smoke),
              "variants": lambda: variant_rows(plan, smoke, measured.get("train", []))}
    for section in sections:
        t0 = time.perf_counter()
        results[section] = measured[section] = makers[section]()
        results[f"{section}_s"] = round(time.perf_counter() - t0, 1)
        out.write_text(json.dumps(results, indent=1))
        out.with_suffix(".md").write_text(table(results))
        print(f"{section}: {results[f'{section}_s']} s", flush=True)
    return results


def table(results: dict) -> str:
    m = results["machine"]
    lines = [f"Device: {m['device']} ({m['platform']}), jax {m['jax']}, cuDNN {m.get('cudnn')}; "
             f"MFU against {m['peak_flops'] / 1e12:,.3g} TFLOP/s ({m['peak_source']}).", ""]
    if "attention" in results:
        lines += ["| attention layer, fwd + grads, bf16 | tokens/row | rows | kernel | tokens/s | "
                  "max rel. error (out, dq, dk, dv) |", "|---|---:|---:|---|---:|---|"]
        for r in results["attention"]:
            err = r.get("max_rel_error")
            cells = (f"{r['tokens_per_s']:,} | " + ", ".join(f"{x:.2g}" for x in err.values())
                     if err else f"- | {r.get('skipped') or r.get('error')}")
            lines.append(f"| {r.get('layout', '-')} | {r['tokens_per_row']:,} | {r.get('rows', '-')} | "
                         f"{r['kernel']} | {cells} |")
        lines.append("")
    if "train" in results:
        lines += ["| train step, bf16 | tokens/row | rows | kernel | tokens/s | MFU | compile s |",
                  "|---|---:|---:|---|---:|---:|---:|"]
        for r in results["train"]:
            cells = (f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {r['compile_s']:.0f}"
                     if "tokens_per_s" in r else f"- | - | {r.get('skipped') or r.get('error')}")
            lines.append(f"| {r['model']} | {r['tokens_per_row']:,} | {r['rows']} | {r['kernel']} | "
                         f"{cells} |")
        lines.append("")
    if "embed" in results:
        lines += ["| sentence vectors, bf16 | tokens/text | texts/s |", "|---|---:|---:|"]
        for r in results["embed"]:
            cell = f"{r['texts_per_s']:,}" if "texts_per_s" in r else r.get("error")
            lines.append(f"| bert_embedding (BERT-Base shape) | {r['tokens_per_text']} | {cell} |")
        lines.append("")
    if "variants" in results:
        lines += ["| ModernBERT-base train step, bf16, one change | tokens/row | rows | kernel | "
                  "tokens/s | MFU |", "|---|---:|---:|---|---:|---:|"]
        for r in results["variants"]:
            cells = (f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%}" if "tokens_per_s" in r
                     else f"- | {r.get('skipped') or r.get('error')}")
            lines.append(f"| {r['variant']} | {r['tokens_per_row']:,} | {r['rows']} | {r['kernel']} | "
                         f"{cells} |")
        lines.append("")
    if "peer" in results:
        ours = {r["tokens_per_row"]: r for r in results.get("train", [])
                if r.get("model") == "modernbert-base" and "tokens_per_s" in r}
        lines += ["| ModernBERT-base train step, bf16 | tokens/row | rows | tokens/s | ours/peer |",
                  "|---|---:|---:|---:|---:|"]
        for r in results["peer"]:
            if "tokens_per_s" not in r:
                lines.append(f"| {r.get('model', 'HF peer')} | {r.get('tokens_per_row', '-')} | "
                             f"- | {r.get('skipped') or r.get('error')} | - |")
                continue
            mine = ours.get(r["tokens_per_row"], {}).get("tokens_per_s")
            ratio = f"{mine / r['tokens_per_s']:.2f}x" if mine else "-"
            lines.append(f"| {r['model']} | {r['tokens_per_row']:,} | {r['rows']} | "
                         f"{r['tokens_per_s']:,.0f} | {ratio} |")
    return "\n".join(lines) + "\n"
