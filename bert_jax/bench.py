"""Benchmarks, run by `make bench` (numbers for issue notes come from here).

  python -m bert_jax.bench data [--text 'books/*.txt'] [--seconds 20]
      Pretraining example creation from pre-tokenized array_record shards (`bert-jax
      prepare` output): sequences per second on one core at max_seq_length 128 (masking,
      NSP pairing, batching; the grain pipeline the trainer uses, without workers).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bert_jax import config as config_lib
from bert_jax.data import documents, pipelines, vocab
from bert_jax.demo import build_corpus


def bench_data(text: str | None, seconds: float, seq_len: int = 128) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    configs = Path(__file__).parents[1] / "configs" / "bert_pretrain.py"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if text is None:
            build_corpus(tmp / "corpus")
            text, fmt = str(tmp / "corpus" / "train.txt"), "sentences"
        else:
            fmt = "paragraphs"
        lines = (line for path in documents.expand(text) for line in open(path, errors="replace"))
        vocab.train_vocab(lines, size=8192, kind="wordpiece", out_dir=tmp / "vocab")
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
    return {"benchmark": "pretraining examples from array_record shards, 1 core",
            "max_seq_length": seq_len, "documents": counts["train"],
            "prepare_seconds": round(prepare_s, 1), "sequences_per_second": round(rate),
            "target": 2000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["data"])
    parser.add_argument("--text", default=None, help="text file globs (default: stdlib docstrings)")
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    print(json.dumps(bench_data(args.text, args.seconds)))


if __name__ == "__main__":
    main()
