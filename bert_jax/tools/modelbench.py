"""Model throughput against the peers (`python -m bert_jax.tools.bench model`, part of `make bench`).

Ours, in this process, on this machine's devices (no simulated devices):
  pretrain   the real train step (train.jit_train_step: MLM + NSP, AdamW as the peers, dropout on) on a fixed
             batch of full-length sequences with 20 masked positions; tokens/s and MFU over the
             timed steps after warmup (MFU: model FLOPs of the objective over the device peak:
             the spec sheet for accelerators, a measured f32 matmul for CPUs).
  finetune   GLUE SST-2 fine-tuning through `train.train_and_evaluate` (the CLI's code path:
             features, packed batches, evaluation on dev): examples/s from the metrics of the
             steps after the first window, and dev accuracy; packed (the default) and padded.
Peers (benchmarks/peers.py, run with the interpreter of their own environment, .venv-peers:
transformers 4.57.6 with torch 2.13.0 and Flax): the same workloads in HF PyTorch and HF Flax
(fine-tuning with dynamic padding, as HF's examples). Results are ratios ours/peer from the
same run, since this machine is shared and noisy. Each model runs as its users get it: HF's
BertForPreTraining projects onto the vocabulary at every position, ours (as the original TF
BERT) at the masked ones only; our fine-tuning examples/s include the compiles of new packed
row counts (torch compiles nothing; the HF Flax fine-tune in peers.py compiles untimed).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from bert_jax import config as config_lib
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.paths import REPO
from bert_jax.tasks import glue
from bert_jax.training import objectives, setup, sharding, state, train
from bert_jax.training.metrics import mfu, peak_flops_per_device

PEERS_SCRIPT = REPO / "benchmarks" / "peers.py"
# name -> (layers, hidden, heads, mlp, batch); sequence length 128 throughout.
SHAPES = {"base": (12, 768, 12, 3072, 8), "small": (4, 256, 4, 1024, 16)}
FINETUNE = {"layers": 6, "hidden": 384, "heads": 6, "mlp": 1536, "batch": 32, "lr": 3e-4,
            "max_seq_length": 128, "vocab": 8000}
# The peers' optimizer (torch.optim.AdamW, optax.adamw: bias-corrected), not the BERT configs'
# adam_weight_decay, so both sides do the same work and reach comparable dev accuracy.
PEERS_OPTIMIZER = ["optimizer.name=adamw"]
log = logging.getLogger(__name__)


def _model_overrides(layers: int, hidden: int, heads: int, mlp: int) -> list[str]:
    return [f"model.num_layers={layers}", f"model.emb_dim={hidden}", f"model.num_heads={heads}",
            f"model.head_dim={hidden // heads}", f"model.mlp_dim={mlp}"]


def full_length_batch(batch: int, seq: int, vocab_size: int, predictions: int = 20) -> dict:
    """Every token real; `predictions` masked positions per sequence; NSP labels."""
    rng = np.random.default_rng(0)
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq), predictions, replace=False)
                                  for _ in range(batch)]), axis=1)
    token_types = (np.arange(seq) >= seq // 2).astype(np.int32)
    return {"input_ids": rng.integers(5, vocab_size, (batch, seq)).astype(np.int32),
            "token_type_ids": np.broadcast_to(token_types, (batch, seq)).astype(np.int32),
            "attention_mask": np.ones((batch, seq), np.int32),
            "masked_lm_positions": positions.astype(np.int32),
            "masked_lm_ids": rng.integers(5, vocab_size, (batch, predictions)).astype(np.int32),
            "masked_lm_weights": np.ones((batch, predictions), np.float32),
            "next_sentence_labels": rng.integers(0, 2, batch).astype(np.int32)}


def pretrain_step(shape: str | tuple, dtype: str, steps: int, warmup: int = 2, seq: int = 128,
                  vocab_size: int = 30522) -> dict:
    """Our train step's tokens/s and MFU at a BERT shape (a SHAPES name or its tuple) and
    compute dtype."""
    layers, hidden, heads, mlp, batch = SHAPES[shape] if isinstance(shape, str) else shape
    config = config_lib.load(str(REPO / "configs" / "bert_pretrain.py:base"), [
        *_model_overrides(layers, hidden, heads, mlp), f"dtype={dtype}", "data.phases=()",
        f"data.max_seq_length={seq}", "data.max_predictions_per_seq=20",
        f"train.batch_size={batch}", f"model.vocab_size={vocab_size}", "mesh.data=-1",
        *PEERS_OPTIMIZER])
    return time_train_step(config, full_length_batch(batch, seq, config.model.vocab_size),
                           steps, warmup)


class OurStep:
    """The real train step of `config` (train.jit_train_step), compiled for one fixed global
    batch and run on demand: `run(steps)` gives their seconds, `metrics` the last step's."""

    def __init__(self, config, batch_np: dict):
        config = config_lib.resolve(config)
        setup.check(config, platform=setup.platform(), devices=jax.device_count(), processes=1,
                    reads_data=False)
        engine = setup.build(config, sharding.make_mesh(config.mesh))
        self.mesh = engine.mesh
        with jax.set_mesh(self.mesh):
            self.state = state.init_state(config, engine.tx, engine.state_sh)
            step_fn = train.jit_train_step(config, engine.graphdef, engine.objective, engine.tx,
                                           engine.schedule, self.mesh, engine.state_sh)
            self.batch = sharding.global_batch(batch_np, self.mesh, 1)
            t0 = time.perf_counter()
            self.step_fn = step_fn.lower(self.state, self.batch).compile()
            self.compile_s = time.perf_counter() - t0
        self.metrics: dict = {}

    def run(self, steps: int) -> float:
        with jax.set_mesh(self.mesh):
            t0 = time.perf_counter()
            for _ in range(steps):
                self.state, metrics = self.step_fn(self.state, self.batch)
            self.metrics = jax.device_get(metrics)
            return time.perf_counter() - t0


def time_train_step(config, batch_np: dict, steps: int, warmup: int = 2) -> dict:
    """The real train step of `config` (train.jit_train_step) on one fixed global batch:
    tokens/s and MFU over `steps` timed steps after `warmup`, and the compile's seconds."""
    ours = OurStep(config, batch_np)
    ours.run(warmup)
    seconds = ours.run(steps)
    metrics = ours.metrics
    peak, source = peak_flops_per_device()
    devices = 1 if jax.devices()[0].platform == "cpu" else jax.device_count()
    return {"tokens_per_s": float(metrics["tokens"]) * steps / seconds,
            "step_s": seconds / steps, "mfu": mfu(float(metrics["flops"]), seconds / steps, devices, peak),
            "peak_flops": peak, "peak_source": source, "compile_s": ours.compile_s,
            "loss": float(metrics["loss"])}


def packed_segments(rows: int, length: int, docs: int, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
    """[rows, length] segment ids (1..docs, every token real) and positions restarting at each
    document, the documents' lengths drawn at random (each at least 1/4 of an even share)."""
    seg = np.zeros((rows, length), np.int32)
    pos = np.zeros((rows, length), np.int32)
    least = max(1, length // (4 * docs))
    for r in range(rows):
        cuts = np.sort(rng.choice(np.arange(1, length - least * docs + 1), docs - 1, replace=False))
        sizes = np.diff(np.concatenate([[0], cuts, [length - least * docs]])) + least
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        for d, (start, size) in enumerate(zip(starts, sizes, strict=True)):
            seg[r, start:start + size] = d + 1
            pos[r, start:start + size] = np.arange(size)
    return seg, pos


def pretraining_batch(config, docs_per_row: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A global batch in the layout `config`'s objective trains on (objective.batch_spec):
    every token real (packed: `docs_per_row` documents per row), data.max_predictions_per_seq
    masked positions per row, random words."""
    config = config_lib.resolve(config)
    spec = objectives.for_config(config).batch_spec(config)
    rng = np.random.default_rng(seed)
    B, T = spec["input_ids"].shape
    P = spec["masked_lm_positions"].shape[1]
    vocab = config.model.vocab_size
    batch = {"input_ids": rng.integers(5, vocab, (B, T)),
             "token_type_ids": np.broadcast_to((np.arange(T) >= T // 2), (B, T)),
             "masked_lm_positions": np.sort(np.stack([rng.choice(np.arange(1, T), P, replace=False)
                                                      for _ in range(B)]), axis=1),
             "masked_lm_ids": rng.integers(5, vocab, (B, P)),
             "masked_lm_weights": np.ones((B, P)),
             "next_sentence_labels": rng.integers(0, 2, (B,)),
             "attention_mask": np.ones((B, T))}
    if "segment_ids" in spec:
        batch["segment_ids"], batch["positions"] = packed_segments(B, T, docs_per_row, rng)
        batch["token_type_ids"] = np.zeros((B, T))
    unknown = sorted(set(spec) - set(batch))
    if unknown:
        raise ValueError(f"{config.model_name}: no bench data for batch keys {unknown}")
    return {k: np.asarray(batch[k], spec[k].dtype) for k in spec}


def sst2_vocab(data_dir: Path, out_dir: Path) -> Path:
    """An uncased WordPiece vocabulary of the SST-2 training sentences (no public one offline)."""
    if not tokenizer_lib.has_tokenizer(out_dir):
        lines = (e.text_a for e in glue.read_glue("sst2", data_dir / "SST-2" / "train.tsv"))
        tokenizer_lib.train_vocab(lines, size=FINETUNE["vocab"], kind="wordpiece", out_dir=out_dir,
                                  lowercase=True)
    return out_dir


def finetune_sst2(data_dir: Path, tokenizer: Path, workdir: Path, steps: int, pack: bool) -> dict:
    """SST-2 fine-tuning of a randomly initialised FINETUNE-shaped BERT, as `bert-jax train`."""
    f = FINETUNE
    n_vocab = tokenizer_lib.load_tokenizer(tokenizer).vocab_size
    log_every = 10
    config = config_lib.load(str(REPO / "configs" / "glue.py:sst2"), [
        *_model_overrides(f["layers"], f["hidden"], f["heads"], f["mlp"]),
        f"model.vocab_size={n_vocab}", f"data.data_dir={data_dir}", f"data.tokenizer={tokenizer}",
        f"data.max_seq_length={f['max_seq_length']}", f"data.pack={pack}",
        f"train.batch_size={f['batch']}", f"train.steps={steps}", f"train.log_every={log_every}",
        f"train.checkpoint_every={steps}", "train.keep_checkpoints=1", f"optimizer.learning_rate={f['lr']}",
        *PEERS_OPTIMIZER])
    t0 = time.perf_counter()
    summary = train.train_and_evaluate(config, str(workdir))
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    windows = [m for m in lines if "steps_per_sec" in m and m["step"] > log_every]
    seconds = sum(log_every / m["steps_per_sec"] for m in windows)  # the last may be shorter: ok
    timed_steps = log_every * len(windows)
    return {"examples_per_s": timed_steps * f["batch"] / seconds,
            "tokens_per_s": float(np.mean([m["tokens_per_sec"] for m in windows])),
            "dev_accuracy": summary["eval"]["eval/accuracy"], "steps": summary["step"],
            "wall_s": wall, "pack": pack}


def run_peer(python: str, args: list[str], timeout: int = 1800) -> dict:
    """One peers.py run in the peers' environment: its JSON line, or {"skipped": why}."""
    try:
        done = subprocess.run([python, str(PEERS_SCRIPT), *args], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "XLA_FLAGS": ""})
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"skipped": f"{type(e).__name__}: {e}"}
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"peers.py exit {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table(results: dict) -> str:
    """The side-by-side table with ratios (ours / peer)."""
    rows = ["| workload | ours | HF Flax | HF PyTorch | ours/Flax | ours/PyTorch |",
            "|---|---|---|---|---|---|"]
    for shape in SHAPES:
        layers, hidden, _, _, batch = SHAPES[shape]
        for dtype in ("float32", "bfloat16"):
            ours = results.get(f"pretrain_{shape}_{dtype}", {})
            flax = results.get(f"hf_flax_pretrain_{shape}", {}) if dtype == "float32" else {}
            torch = results.get(f"hf_torch_pretrain_{shape}", {}) if dtype == "float32" else {}
            t = ours.get("tokens_per_s")
            cell = f"{t:,.0f} tok/s (MFU {ours['mfu']:.1%})" if t else "-"
            rows.append(f"| pretraining step, {layers}x{hidden}, seq 128, batch {batch}, {dtype} | "
                        f"{cell} | {_num(flax, 'tokens_per_s')} | {_num(torch, 'tokens_per_s')} | "
                        f"{_ratio(t, flax.get('tokens_per_s'))} | {_ratio(t, torch.get('tokens_per_s'))} |")
    f = FINETUNE
    torch = results.get("hf_torch_finetune_sst2", {})
    for key, label in (("finetune_sst2_packed", "packed"), ("finetune_sst2_padded", "padded to 128")):
        ours = results.get(key, {})
        e = ours.get("examples_per_s")
        cell = f"{e:.1f} ex/s (dev acc {ours['dev_accuracy']:.3f})" if e else "-"
        peer = (f"{torch['examples_per_s']:.1f} ex/s (dev acc {torch['dev_accuracy']:.3f})"
                if torch.get("examples_per_s") else torch.get("skipped", "-"))
        rows.append(f"| SST-2 fine-tuning {f['layers']}x{f['hidden']}, batch {f['batch']}, ours "
                    f"{label}, HF dynamic padding | {cell} | | {peer} | | "
                    f"{_ratio(e, torch.get('examples_per_s'))} |")
    return "\n".join(rows)


def _num(r: dict, key: str) -> str:
    return f"{r[key]:,.0f}" if r.get(key) else (r.get("skipped", "-")[:60] if r else "-")


def bench_model(*, peers_python: str | None, data_dir: Path, steps: int = 10,
                finetune_steps: int = 250, out: Path | None = None) -> dict:
    results: dict = {"machine": {"devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
                                 "cpus": os.cpu_count()}}
    peer_ok = peers_python and Path(peers_python).exists() and PEERS_SCRIPT.exists()
    why_no_peers = None if peer_ok else (f"no peers environment at {peers_python} (make peers-env)"
                                         if peers_python else "peers disabled (--peers none)")
    for shape, (layers, hidden, heads, mlp, batch) in SHAPES.items():
        for dtype in ("float32", "bfloat16"):
            results[f"pretrain_{shape}_{dtype}"] = pretrain_step(shape, dtype, steps)
            print(f"ours pretrain {shape} {dtype}: {json.dumps(results[f'pretrain_{shape}_{dtype}'])}",
                  file=sys.stderr, flush=True)
        for framework in ("flax", "torch"):
            args = ["pretrain", "--framework", framework, "--layers", str(layers), "--hidden",
                    str(hidden), "--heads", str(heads), "--mlp", str(mlp), "--seq", "128",
                    "--batch", str(batch), "--steps", str(steps), "--warmup", "2",
                    "--dtype", "float32"]
            r = run_peer(peers_python, args) if peer_ok else {"skipped": why_no_peers}
            results[f"hf_{framework}_pretrain_{shape}"] = r
            print(f"hf {framework} pretrain {shape}: {json.dumps(r)}", file=sys.stderr, flush=True)
    if not (data_dir / "SST-2" / "train.tsv").is_file():
        results["finetune_sst2_packed"] = {"skipped": f"no {data_dir}/SST-2/train.tsv"}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            tokenizer = sst2_vocab(data_dir, tmp / "vocab")
            for pack in (True, False):
                key = f"finetune_sst2_{'packed' if pack else 'padded'}"
                results[key] = finetune_sst2(data_dir, tokenizer, tmp / key, finetune_steps, pack)
                print(f"ours {key}: {json.dumps(results[key])}", file=sys.stderr, flush=True)
            f = FINETUNE
            args = ["finetune", "--framework", "torch", "--vocab_dir", str(tokenizer),
                    "--train", str(data_dir / "SST-2" / "train.tsv"),
                    "--dev", str(data_dir / "SST-2" / "dev.tsv"), "--layers", str(f["layers"]),
                    "--hidden", str(f["hidden"]), "--heads", str(f["heads"]), "--mlp", str(f["mlp"]),
                    "--batch", str(f["batch"]), "--steps", str(finetune_steps), "--lr", str(f["lr"]),
                    "--warmup_ratio", "0.1", "--max_seq_length", str(f["max_seq_length"]), "--seed", "0"]
            r = run_peer(peers_python, args) if peer_ok else {"skipped": why_no_peers}
            results["hf_torch_finetune_sst2"] = r
            print(f"hf torch finetune: {json.dumps(r)}", file=sys.stderr, flush=True)
    results["table"] = table(results)
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")
    return results
