"""Time to quality (`python -m bert_jax.tools.bench pretrain`; docs/modernbert.md#time-to-quality).

One corpus (WikiText-2 valid+test and the Gutenberg books of ../shared/data/text, read as
documents of >= 32 sentences by the pretraining reader; every HELDOUT_EVERY-th document held
out), one 8,192-token WordPiece vocabulary trained on the training documents, and the same
model shape (`mini`: 4 x 256) pretrained three ways with the same rows per step (batch x
max_seq_length slots) and the same number of steps, on this machine's CPU cores (XLA's
default thread pool: every core; torch.set_num_threads(os.cpu_count())):

  bert2018  configs/bert_pretrain.py:mini: [CLS] A [SEP] B [SEP] pairs + NSP, 15% masking,
            post-LN, learned positions, AdamW, warmup then linear decay;
  modern    configs/modernbert.py:mini: masked LM only on packed documents, 30% masking,
            rope, GeGLU, pre-norm without biases, local/global attention, StableAdamW + wsd;
  hf        HF PyTorch BertForMaskedLM of the bert2018 shape (no NSP), BertTokenizerFast on the
            same vocab.txt, each training document cut into sequences of max_seq_length - 2
            tokens + [CLS]/[SEP] (shuffled), DataCollatorForLanguageModeling at 15% with dynamic
            padding, torch AdamW (no decay on biases and LayerNorm, as HF's Trainer), gradient
            clipping at 1.0, get_linear_schedule_with_warmup (bert2018's lr and warmup).

Quality is the held-out masked-LM loss measured the same way for all three on every saved
checkpoint: one fixed numpy set of held-out sequences (`[CLS] piece [SEP]`, one segment, at most
max_seq_length tokens), masked once at 15% (80/10/10) with the project's masking and a fixed seed;
mean cross-entropy over the masked positions (ours: state.load_model + the model's forward at the
masked positions; HF: the torch model's logits gathered there).

Time: `train_s`, the training loop's seconds up to the checkpoint, making batches included, without
one-time init and compilation, checkpoint saving and in-run evaluation; `wall_s`, the same plus init
and compilation (ours: goodput.json's categories; torch compiles nothing). Data preparation
(corpus files, vocabulary, the HF side's tokenization up front as datasets.map does) is outside both.

Then each pretrained model is fine-tuned on SST-2 (configs/glue.py:sst2,mini or
sst2,modernbert-mini with init_from; the HF model after `bert-jax convert hf:` of its
save_pretrained folder), the same steps and settings, and scored on dev.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from bert_jax import config as config_lib
from bert_jax import paths
from bert_jax.data import pretraining
from bert_jax.data import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)

HELDOUT_EVERY = 20  # every 20th document of the corpus is held out for evaluation
EVAL_MASKED_LM_PROB = 0.15
RECIPES = ("bert2018", "modern", "hf")
CONFIGS = {"bert2018": "configs/bert_pretrain.py:{size}", "modern": "configs/modernbert.py:{size}"}
FINETUNE_CONFIGS = {"bert2018": "configs/glue.py:sst2,{size}", "hf": "configs/glue.py:sst2,{size}",
                    "modern": "configs/glue.py:sst2,modernbert-{size}"}
LABELS = {"bert2018": "BERT 2018 recipe (ours)", "modern": "modern recipe (ours)",
          "hf": "HF PyTorch BertForMaskedLM"}


def source_files(shared: Path) -> list[Path]:
    """The corpus: WikiText-2 valid and test, then the Gutenberg books (sorted)."""
    text = shared / "text"
    files = [text / "wikitext2" / "valid.txt", text / "wikitext2" / "test.txt",
             *sorted((text / "gutenberg").glob("*.txt"))]
    missing = [str(p) for p in files if not p.is_file()]
    if missing or len(files) < 3:
        raise FileNotFoundError(f"no corpus at {text} ({missing[:1] or 'no books'}); "
                         "set BERT_JAX_SHARED_DATA to the shared data folder")
    return files


def build_corpus(files: list[Path], out: Path, *, heldout_every: int = HELDOUT_EVERY,
                 vocab_size: int = 8192) -> dict[str, Any]:
    """train.txt and heldout.txt under `out` (the pretraining reader's `sentences` format: one
    sentence a line, a blank line between documents; every heldout_every-th document of
    `files`, read as `paragraphs`, held out) and a WordPiece vocab on train.txt in out/vocab."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "heldout": 0}
    with open(out / "train.txt", "w") as train, open(out / "heldout.txt", "w") as heldout:
        i = 0
        for path in files:
            for doc in pretraining.iter_documents(path, "paragraphs"):
                i += 1
                split = "heldout" if i % heldout_every == 0 else "train"
                (heldout if split == "heldout" else train).write("\n".join(doc) + "\n\n")
                counts[split] += 1
    if not tokenizer_lib.has_tokenizer(out / "vocab"):
        with open(out / "train.txt") as f:
            tokenizer_lib.train_vocab(f, size=vocab_size, kind="wordpiece", out_dir=out / "vocab")
    counts["vocab_size"] = tokenizer_lib.load_tokenizer(out / "vocab").vocab_size
    return counts


def heldout_set(heldout: Path, tokenizer, *, rows: int, seq_len: int, seed: int = 0
                ) -> dict[str, np.ndarray]:
    """`rows` held-out sequences `[CLS] piece [SEP]` (pieces of seq_len - 2 tokens of each
    held-out document; a fixed random choice of them), padded to seq_len, masked once at 15%
    (80/10/10), with up to round(0.15 * seq_len) predictions each: numpy arrays [rows, ...]."""
    pieces = [p for doc in pretraining.iter_documents(heldout, "sentences")
              for p in pretraining.document_pieces(pretraining.tokenize_document(doc, tokenizer),
                                                   seq_len - 2) if len(p) >= 8]
    rng = np.random.default_rng(seed)
    if len(pieces) < rows:
        raise ValueError(f"{heldout}: {len(pieces)} held-out sequences, fewer than rows={rows}")
    chosen = sorted(rng.choice(len(pieces), rows, replace=False))
    P = max(1, round(EVAL_MASKED_LM_PROB * seq_len))
    feats = [pretraining.pad_features(pretraining.sequence_features(
        pieces[i], cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, max_seq_length=seq_len,
        rng=rng, vocab_size=tokenizer.vocab_size, special_ids=tokenizer.special_ids,
        mask_id=tokenizer.mask_id, max_predictions_per_seq=P,
        masked_lm_prob=EVAL_MASKED_LM_PROB), seq_len, P) for i in chosen]
    return {k: np.stack([f[k] for f in feats]) for k in feats[0]}


def masked_lm_loss(logits_NPV: np.ndarray, labels_NP: np.ndarray, weights_NP: np.ndarray
                   ) -> tuple[float, float]:
    """(sum of cross-entropies, number of correct predictions) over the weighted positions."""
    x = logits_NPV.astype(np.float64)
    top = x.max(-1, keepdims=True)
    lse = np.log(np.exp(x - top).sum(-1)) + top[..., 0]
    ce = lse - np.take_along_axis(x, labels_NP[..., None], -1)[..., 0]
    ok = x.argmax(-1) == labels_NP
    return float((ce * weights_NP).sum()), float((ok * weights_NP).sum())


def _score(forward, evalset: dict[str, np.ndarray], batch: int) -> dict[str, float]:
    """Held-out MLM loss and accuracy of `forward(batch dict) -> logits at the masked positions`."""
    total = correct = 0.0
    n = float(evalset["masked_lm_weights"].sum())
    for i in range(0, len(evalset["input_ids"]), batch):
        b = {k: v[i:i + batch] for k, v in evalset.items()}
        ce, ok = masked_lm_loss(forward(b), b["masked_lm_ids"], b["masked_lm_weights"])
        total, correct = total + ce, correct + ok
    return {"heldout_mlm_loss": total / n, "heldout_mlm_accuracy": correct / n}


def score_ours(workdir: Path, steps: list[int], evalset: dict[str, np.ndarray], batch: int = 64
               ) -> dict[int, dict[str, float]]:
    """The held-out MLM loss of our checkpoints `steps` in workdir (one compile for all)."""
    import jax
    from flax import nnx

    from bert_jax.training import checkpoint, objectives, state

    keys = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions")
    objective = objectives.Pretraining(checkpoint.read_config(workdir, steps[0])["model"])

    @nnx.jit
    def logits(model, b):
        return objective.forward(model, b, None)["mlm_logits"].astype(jax.numpy.float32)

    out = {}
    for step in steps:
        _, model = state.load_model(workdir, step)

        def forward(b, model=model):
            return np.asarray(logits(model, {k: b[k] for k in keys}))
        out[step] = _score(forward, evalset, batch)
    return out


def score_hf(folders: dict[int, Path], evalset: dict[str, np.ndarray], batch: int = 64,
             model_class=None) -> dict[int, dict[str, float]]:
    """The held-out MLM loss of HF BertForMaskedLM folders (step -> folder; `model_class`:
    another masked LM, e.g. ModernBertForMaskedLM, given token types only if it is a BERT)."""
    import torch
    from transformers import BertForMaskedLM

    out = {}
    for step, folder in folders.items():
        model = (model_class or BertForMaskedLM).from_pretrained(folder).eval()
        names = ("input_ids", "attention_mask") + (
            ("token_type_ids",) if model.config.model_type == "bert" else ())

        def forward(b, model=model, names=names):
            with torch.no_grad():
                logits = model(**{k: torch.from_numpy(b[k].astype(np.int64)) for k in names}).logits
                pos = torch.from_numpy(b["masked_lm_positions"].astype(np.int64))
                return torch.take_along_dim(logits, pos[..., None], dim=1).numpy()
        out[step] = _score(forward, evalset, batch)
    return out


def our_overrides(recipe: str, corpus: Path, *, steps: int, batch: int, seq_len: int,
                  every: int) -> list[str]:
    """The overrides of CONFIGS[recipe] shared by the runs: data, rows per step, steps and
    checkpoints (every `every` steps, all kept, a metrics line at each)."""
    predictions = (round(0.3 * seq_len) + 1 if recipe == "modern"  # room at 30%, as the config
                   else round(EVAL_MASKED_LM_PROB * seq_len))
    return [f"data.tokenizer={corpus / 'vocab'}", f"data.train_files={corpus / 'train.txt'}",
            f"data.eval_files={corpus / 'heldout.txt'}", "data.text_format=sentences",
            f"data.max_seq_length={seq_len}", f"data.max_predictions_per_seq={predictions}",
            f"train.batch_size={batch}", f"train.steps={steps}",
            f"schedule.warmup_steps={max(1, steps // 10)}", f"train.checkpoint_every={every}",
            f"train.log_every={every}", "train.eval_every=0", "train.eval_steps=1",
            f"train.keep_checkpoints={steps // every + 2}"]


def _timeline(workdir: Path) -> dict[int, dict[str, float]]:
    """Per metrics line of a run: train_s (loop without compile, init, save, eval), wall_s (with
    init and compile), and real tokens per step."""
    from bert_jax.training import metrics

    out = {}
    for r in metrics.read_metrics(workdir / metrics.METRICS_FILE):
        if "goodput/wall_s" not in r:
            continue
        excluded = r["goodput/save_s"] + r["goodput/eval_s"]
        out[r["step"]] = {
            "wall_s": r["goodput/wall_s"] - excluded,
            "train_s": r["goodput/wall_s"] - excluded - r["goodput/init_s"] - r["goodput/compile_s"],
            "tokens_per_step": r["tokens_per_sec"] / r["steps_per_sec"]}
    return out


def pretrain_ours(recipe: str, size: str, corpus: Path, workdir: Path, **shape) -> dict:
    """Pretrains CONFIGS[recipe] in workdir (from scratch); its timeline per checkpoint."""
    from bert_jax.training import train

    shutil.rmtree(workdir, ignore_errors=True)
    spec = str(paths.REPO / CONFIGS[recipe].format(size=size))
    config = config_lib.load(spec, our_overrides(recipe, corpus, **shape))
    t0 = time.perf_counter()
    train.train_and_evaluate(config, str(workdir))
    return {"config": CONFIGS[recipe].format(size=size), "process_s": time.perf_counter() - t0,
            "timeline": _timeline(workdir)}


def pretrain_hf(size: str, corpus: Path, workdir: Path, *, steps: int, batch: int, seq_len: int,
                every: int, seed: int = 0) -> dict:
    """HF PyTorch BertForMaskedLM with HF's MLM collator (15%, dynamic padding), the bert2018
    config's shape, lr, warmup and optimizer settings; save_pretrained every `every` steps."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        get_linear_schedule_with_warmup,
    )

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ours = config_lib.load(str(paths.REPO / CONFIGS["bert2018"].format(size=size)),
                           our_overrides("bert2018", corpus, steps=steps, batch=batch,
                                         seq_len=seq_len, every=every))
    m, o = ours.model, ours.optimizer
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(seed)
    # the vocab folder's vocab.txt and tokenizer_config.json (transformers 5's constructor
    # takes `vocab`, and ignores a `vocab_file`: every token would be [UNK])
    tokenizer = BertTokenizerFast.from_pretrained(str(corpus / "vocab"))
    t0 = time.perf_counter()  # data preparation: not timed in train_s or wall_s
    texts = [" ".join(doc) for doc in pretraining.iter_documents(corpus / "train.txt", "sentences")]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    same = tokenizer_agreement(encoded, texts, corpus / "vocab")
    examples = []
    for ids in encoded:
        examples += [[tokenizer.cls_token_id, *ids[i:i + seq_len - 2], tokenizer.sep_token_id]
                     for i in range(0, len(ids), seq_len - 2)]
    prep_s = time.perf_counter() - t0

    t_start = time.perf_counter()
    config = BertConfig(vocab_size=m.vocab_size, hidden_size=m.emb_dim,
                        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                        intermediate_size=m.mlp_dim, max_position_embeddings=m.max_len,
                        type_vocab_size=m.type_vocab_size, hidden_dropout_prob=m.dropout_rate,
                        attention_probs_dropout_prob=m.attention_dropout_rate,
                        layer_norm_eps=m.layer_norm_eps, hidden_act="gelu")
    model = BertForMaskedLM(config).train()
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    schedule = get_linear_schedule_with_warmup(optimizer, ours.schedule.warmup_steps, steps)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=EVAL_MASKED_LM_PROB,
                                               seed=seed)
    order_rng = np.random.default_rng(seed)
    init_s = time.perf_counter() - t_start
    timeline, folders, order, train_s, tokens, saved_s = {}, {}, [], 0.0, 0, 0.0
    for step in range(1, steps + 1):
        t = time.perf_counter()
        if len(order) < batch:  # a new epoch, reshuffled; the last partial batch dropped
            order = list(order_rng.permutation(len(examples)))
        rows, order = order[:batch], order[batch:]
        b = collator([{"input_ids": examples[i]} for i in rows])
        loss = torch_step(model, optimizer, schedule, b, o.grad_clip_norm)
        tokens += int(b["attention_mask"].sum())
        train_s += time.perf_counter() - t
        if step % every == 0 or step == steps:
            t = time.perf_counter()
            folders[step] = workdir / f"step_{step}"
            model.save_pretrained(folders[step])
            saved_s += time.perf_counter() - t
            timeline[step] = {"train_s": train_s, "wall_s": init_s + train_s,
                              "tokens_per_step": tokens / step, "train_loss": float(loss.detach())}
    tokenizer.save_pretrained(folders[steps])
    # transformers 5 saves a WordPiece tokenizer as tokenizer.json only; `bert-jax convert`
    # reads a BERT folder's vocab.txt (as the Hub's BERT folders have it)
    shutil.copy(corpus / "vocab" / "vocab.txt", folders[steps] / "vocab.txt")
    return {"config": f"HF BertForMaskedLM, shape of {CONFIGS['bert2018'].format(size=size)}",
            "prepare_s": prep_s, "examples": len(examples), "same_tokens_as_ours": same, "save_s": saved_s,
            "threads": torch.get_num_threads(), "timeline": timeline, "folders": folders}


def torch_step(model, optimizer, schedule, inputs: dict, clip: float):
    """One torch training step on `inputs` (the model's keyword arguments, labels included):
    backward, gradient clipping at `clip` (none at 0), the optimizer's and schedule's steps;
    returns the loss."""
    import torch

    loss = model(**inputs).loss
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def tokenizer_agreement(encoded: list[list[int]], texts: list[str], vocab: Path,
                        n: int = 200) -> float:
    """The fraction of the first n documents that HF's tokenizer (`encoded`) and ours tokenize
    alike; below 0.99 stops the run (the recipes would not see the same tokens)."""
    ours = tokenizer_lib.load_tokenizer(vocab).encode_batch(texts[:n])
    same = float(np.mean([list(a) == list(b) for a, b in zip(ours, encoded[:n])]))
    if same < 0.99:
        raise RuntimeError(f"HF's BertTokenizerFast on {vocab} tokenizes {same:.0%} of the first "
                           f"{len(ours)} documents as ours does; expected the same ids")
    return same


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """The first time the (time, loss) curve reaches `target`, interpolated linearly between the
    checkpoints around the crossing; None if it never does."""
    prev = None
    for t, loss in points:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return t
            (t0, l0) = prev
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        prev = (t, loss)
    return None


def summarize(runs: dict[str, dict]) -> dict[str, Any]:
    """The common target (the worst recipe's best held-out loss: every recipe reaches it), each
    recipe's time to it (train_s and wall_s) and the ratios against HF."""
    best = {r: min(p["heldout_mlm_loss"] for p in run["timeline"].values()) for r, run in runs.items()}
    target = max(best.values())
    out: dict[str, Any] = {"target_loss": round(target, 4), "target_rule":
                           "the highest of the recipes' best held-out losses (all reach it)",
                           "best_loss": {r: round(v, 4) for r, v in best.items()}, "time_to_target": {}}
    for r, run in runs.items():
        steps = sorted(run["timeline"])
        out["time_to_target"][r] = {
            clock: time_to([(run["timeline"][s][clock], run["timeline"][s]["heldout_mlm_loss"])
                            for s in steps], target) for clock in ("train_s", "wall_s")}
        out["time_to_target"][r]["step"] = time_to(
            [(s, run["timeline"][s]["heldout_mlm_loss"]) for s in steps], target)
    if "hf" in runs:
        hf = out["time_to_target"]["hf"]
        out["speedup_vs_hf"] = {r: {c: (hf[c] / t[c] if hf[c] and t[c] else None)
                                    for c in ("train_s", "wall_s")}
                                for r, t in out["time_to_target"].items() if r != "hf"}
    return out


def tables(runs: dict[str, dict], summary: dict, finetune: dict | None) -> str:
    """The markdown tables: held-out loss per checkpoint, time to target, SST-2 dev accuracy."""
    steps = sorted(next(iter(runs.values()))["timeline"])
    lines = ["| step | " + " | ".join(f"{r}: held-out MLM loss @ train_s (wall_s)" for r in runs)
             + " |", "|---:|" + "---|" * len(runs)]
    for s in steps:
        cells = []
        for run in runs.values():
            p = run["timeline"].get(s)
            cells.append("-" if p is None else
                         f"{p['heldout_mlm_loss']:.3f} @ {p['train_s']:.0f} s ({p['wall_s']:.0f} s)")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    t = summary["time_to_target"]
    lines += ["", f"Target: held-out MLM loss {summary['target_loss']:.3f} ({summary['target_rule']}).",
              "", "| recipe | real tokens / step | best held-out loss | step reaching target | "
              "train_s to target | wall_s to target | HF / this (train_s) | HF / this (wall_s) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def fmt(x, spec=".0f"):
        return "-" if x is None else format(x, spec)
    for r, run in runs.items():
        tokens = np.mean([p["tokens_per_step"] for p in run["timeline"].values()])
        ratio = summary.get("speedup_vs_hf", {}).get(r, {})
        lines.append(f"| {LABELS.get(r, r)} | {tokens:.0f} | {summary['best_loss'][r]:.3f} | "
                     f"{fmt(t[r]['step'])} | {fmt(t[r]['train_s'])} | {fmt(t[r]['wall_s'])} | "
                     f"{fmt(ratio.get('train_s'), '.2f')}{'x' if ratio.get('train_s') else ''} | "
                     f"{fmt(ratio.get('wall_s'), '.2f')}{'x' if ratio.get('wall_s') else ''} |")
    if finetune:
        lines += ["", "| pretrained by | SST-2 config | SST-2 dev accuracy | fine-tuning wall s |",
                  "|---|---|---:|---:|"]
        lines += [f"| {LABELS.get(r, r)} | {f['config']} | {f['dev_accuracy']:.3f} | {f['wall_s']:.0f} |"
                  for r, f in finetune.items()]
    return "\n".join(lines)


def finetune(recipe: str, size: str, init_from: Path, glue_dir: Path, workdir: Path, *,
             steps: int, overrides: list[str] = (), spec: str | None = None) -> dict:
    """SST-2 from a pretrained checkpoint: FINETUNE_CONFIGS[recipe] (or `spec`, any GLUE task's
    config), `steps` steps, dev accuracy and every dev metric (`eval`)."""
    from bert_jax.training import train

    shutil.rmtree(workdir, ignore_errors=True)
    spec = spec or FINETUNE_CONFIGS[recipe].format(size=size)
    given = [f"init_from={init_from}", f"data.data_dir={glue_dir}", f"train.steps={steps}",
             *overrides]
    config = config_lib.load(str(paths.REPO / spec), given)
    t0 = time.perf_counter()
    summary = train.train_and_evaluate(config, str(workdir),
                                       set_by_user=[g.partition("=")[0] for g in given])
    return {"config": spec, "steps": summary["step"],
            "dev_accuracy": summary["eval"].get("eval/accuracy"), "eval": summary["eval"],
            "wall_s": time.perf_counter() - t0}


def convert_hf(folder: Path, out: Path) -> Path:
    """`bert-jax convert hf:<folder> <out>` in this process."""
    from bert_jax.interop import convert

    shutil.rmtree(out, ignore_errors=True)
    convert.convert_hf(folder, out)
    return out


def bench_pretrain(workdir: str, *, size: str = "mini", steps: int = 200, batch: int = 32,
                   seq_len: int = 128, every: int = 20, eval_rows: int = 512,
                   finetune_steps: int = 250, recipes: tuple[str, ...] = RECIPES,
                   files: list[Path] | None = None, glue_dir: Path | None = None,
                   vocab_size: int = 8192, heldout_every: int = HELDOUT_EVERY,
                   finetune_overrides: list[str] = ()) -> dict[str, Any]:
    """The whole section: corpus and vocab, pretraining and scoring per recipe, the summary,
    fine-tuning (finetune_steps > 0). Writes result.json and result.md in workdir."""
    work = Path(workdir)
    shared = paths.shared_data()
    t0 = time.perf_counter()
    corpus = build_corpus(files or source_files(shared), work / "corpus",
                          heldout_every=heldout_every, vocab_size=vocab_size)
    tokenizer = tokenizer_lib.load_tokenizer(work / "corpus" / "vocab")
    evalset = heldout_set(work / "corpus" / "heldout.txt", tokenizer, rows=eval_rows,
                          seq_len=seq_len)
    prepare_s = time.perf_counter() - t0
    shape = {"steps": steps, "batch": batch, "seq_len": seq_len, "every": every}
    runs: dict[str, dict] = {}
    for recipe in recipes:
        log.info(f"bench pretrain: {recipe}")
        run_dir = work / recipe
        if recipe == "hf":
            run = pretrain_hf(size, work / "corpus", run_dir, **shape)
            scores = score_hf(run["folders"], evalset)
        else:
            run = pretrain_ours(recipe, size, work / "corpus", run_dir, **shape)
            scores = score_ours(run_dir, sorted(run["timeline"]), evalset)
        for step, s in scores.items():
            run["timeline"][step].update(s)
        runs[recipe] = run
    summary = summarize(runs)
    finetuned = {}
    if finetune_steps:
        glue = glue_dir or shared / "glue"
        for recipe in recipes:
            init = (convert_hf(runs["hf"]["folders"][steps], work / "hf_converted")
                    if recipe == "hf" else work / recipe)
            finetuned[recipe] = finetune(recipe, size, init, glue, work / f"sst2_{recipe}",
                                         steps=finetune_steps, overrides=list(finetune_overrides))
    for run in runs.values():
        run.pop("folders", None)
    result = {"benchmark": f"time to quality, {size}: {steps} steps of {batch} x {seq_len} "
                           f"tokens, held-out MLM loss at 15% on {eval_rows} sequences",
              "corpus": corpus, "prepare_s": prepare_s, "cpu_count": os.cpu_count(),
              "runs": runs, "summary": summary, "finetune": finetuned,
              "table": tables(runs, summary, finetuned)}
    (work / "result.json").write_text(json.dumps(rounded(result), indent=1) + "\n")
    (work / "result.md").write_text(result["table"] + "\n")
    return result


def rounded(x):
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {str(k): rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x
