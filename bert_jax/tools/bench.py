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
from bert_jax.data import documents, packing, pretraining
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
        counts = documents.prepare(config, tmp / "shards")
        prepare_s = time.perf_counter() - t0
        config.data.name, config.data.train_files = "array_record", str(tmp / "shards" / "train-*")
        pipeline = pipelines.make(config, "train")
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
        pipeline = pipelines.make(cfg, "train")
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
        raise SystemExit(f"no books in {books} (set BERT_JAX_SHARED_DATA)")
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
    rows = {"first run (empty cache)": _first_step(
        [*argv, f"--compilation_cache={cache}"], first_run, 0, root / "first.log")}
    saved = max(int(p.name) for p in (first_run / "checkpoints").iterdir() if p.name.isdigit())
    shutil.copytree(first_run, resumed_off)
    rows["resumed, cache on"] = _first_step([*argv, f"--compilation_cache={cache}"], first_run,
                                            saved, root / "resumed_cache_on.log")
    rows["resumed, cache off"] = _first_step([*argv, "--compilation_cache=off"], resumed_off,
                                             saved, root / "resumed_cache_off.log")
    table = ["| run | to first step (s) | of which compile (s) | init (s) |", "|---|---:|---:|---:|"]
    table += [f"| {name} | {r['first_step_s']} | {r['compile_s']} | {r['init_s']} |"
              for name, r in rows.items()]
    return {"benchmark": "time to the first step, first run and resumed run",
            "config": config, "overrides": overrides, "resumed_from_step": saved, "runs": rows,
            "cache_bytes": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()),
            "table": "\n".join(table), "out": str(root)}


def translation_lines(spec: str):
    for path in documents.expand(spec):
        yield from documents.read_lines(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["data", "multi30k", "model", "restart", "long"])
    parser.add_argument("--peers", default=".venv-peers/bin/python",
                        help="model: the peers' Python ('none': ours only)")
    parser.add_argument("--glue", default=None, help="model: GLUE folder with SST-2/ "
                        "(default ../shared/data/glue beside the checkout or $BERT_JAX_SHARED_DATA)")
    parser.add_argument("--steps", type=int, default=10, help="model: timed pretraining steps")
    parser.add_argument("--finetune_steps", type=int, default=250)
    parser.add_argument("--out", default="bench_model.json", help="model: results file")
    parser.add_argument("--workdir", default=None, help="multi30k: run directory (default "
                        "runs/multi30k_bench); long: its runs (default runs/long_bench); "
                        "restart: where the runs and the cache go (default: "
                        "a new temporary folder)")
    parser.add_argument("--config", default="configs/bert_pretrain.py:tiny", help="restart: the "
                        "config trained")
    parser.add_argument("--text", default=None, help="text file globs (default: stdlib docstrings)")
    parser.add_argument("--seconds", type=float, default=20)
    args, rest = parser.parse_known_args()
    if args.what in ("multi30k", "restart", "long"):
        bad = [a for a in rest if not a.startswith("--config.")]
        if bad:
            parser.error(f"unrecognized arguments: {' '.join(bad)}")
        if args.what == "long":
            result = bench_long(args.workdir or "runs/long_bench", [a[9:] for a in rest])
            print(result["table"])
            print(json.dumps(result))
            return
        if args.what == "multi30k":
            print(json.dumps(bench_multi30k(args.workdir or "runs/multi30k_bench",
                                            [a[9:] for a in rest])))
            return
        result = bench_restart(args.config, rest, args.workdir)
        print(result["table"])
        print(json.dumps(result))
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.what == "model":
        logging.basicConfig(level=logging.WARNING)
        shared = paths.shared_data()
        results = modelbench.bench_model(
            peers_python=None if args.peers == "none" else args.peers,
            data_dir=Path(args.glue) if args.glue else shared / "glue", steps=args.steps,
            finetune_steps=args.finetune_steps, out=Path(args.out))
        print(results["table"])
        print(f"(all results: {args.out})")
        return
    print(json.dumps(bench_data(args.text, args.seconds)))


if __name__ == "__main__":
    from bert_jax.main import setup_process

    setup_process()
    main()
