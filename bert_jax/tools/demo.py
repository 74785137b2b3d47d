"""`make demo`: BERT pretraining end to end, offline, in a few minutes on a CPU.

1. builds an English corpus from the docstrings of the Python standard library (present
   wherever Python is; parsed with `ast`, nothing imported or downloaded), one document
   per module, every 20th module held out;
2. trains a WordPiece vocabulary on it (`bert-jax vocab`);
3. pretrains a tiny BERT with MLM + NSP (`bert-jax train`), saving Orbax checkpoints;
4. restores the last checkpoint and evaluates it on the held-out modules (`bert-jax eval`);
5. draws the training curves (`bert-jax plot`) and the attention of every layer and head
   for one sentence pair (`bert-jax attention`: a PNG and an interactive HTML page);
6. prints a summary. Each step prints the command it runs, so it can be rerun by hand.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bert_jax.data.pretraining import split_sentences
from bert_jax.paths import REPO
from bert_jax.training.metrics import read_metrics

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
             "lib2to3", "turtledemo", "ensurepip"}
HELD_OUT_EVERY = 20
ATTENTION_TEXT = ("Return the number of items in the list.", "The list may be empty.")


def _module_sentences(path: Path) -> list[str]:
    """The prose sentences of a module's docstrings (doctest and code-like lines dropped)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    sentences = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node) or ""
            for para in re.split(r"\n\s*\n", doc):
                lines = [ln.strip() for ln in para.splitlines()]
                if any(ln.startswith((">>>", "...", "$")) for ln in lines) or para.startswith(" "):
                    continue
                text = " ".join(lines)
                if len(re.findall(r"[A-Za-z]{2,}", text)) >= 4:  # prose, not a signature
                    sentences.extend(split_sentences(text))
    return sentences


def build_corpus(out_dir: Path) -> dict[str, int]:
    """train.txt and heldout.txt in the original format: one sentence per line, a blank
    line between documents (modules)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py")
                   if not SKIP_DIRS & set(p.relative_to(stdlib).parts))
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = {"modules": 0, "train_sentences": 0, "heldout_sentences": 0}
    with open(out_dir / "train.txt", "w") as train, open(out_dir / "heldout.txt", "w") as held:
        for path in files:
            sentences = _module_sentences(path)
            if len(sentences) < 2:
                continue
            held_out = stats["modules"] % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
            (held if held_out else train).write("\n".join(sentences) + "\n\n")
            stats["modules"] += 1
            stats["heldout_sentences" if held_out else "train_sentences"] += len(sentences)
    return stats


def _run(*args: str) -> str:
    cmd = [sys.executable, "-m", "bert_jax", *args]
    print("\n$ bert-jax " + " ".join(shlex.quote(a) for a in args), flush=True)
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:  # streamed: training prints progress as it goes
            print(line, end="", flush=True)
            lines.append(line)
    if proc.returncode != 0:
        sys.exit(f"demo: `bert-jax {args[0]}` failed with exit code {proc.returncode}")
    return "".join(lines)


def main(out: str = "demo_out", steps: int = 1000) -> None:
    root = Path(out).absolute()
    t0 = time.time()
    print(f"== 1. corpus: Python {sys.version.split()[0]} standard library docstrings")
    stats = build_corpus(root / "corpus")
    print(json.dumps(stats))
    print("== 2. WordPiece vocabulary")
    _run("vocab", f"--input={root / 'corpus' / 'train.txt'}", "--size=8192", "--type=wordpiece",
         f"--out={root / 'vocab'}") if not (root / "vocab" / "vocab.txt").exists() else None
    run = [f"--config={REPO / 'configs' / 'bert_pretrain.py'}:tiny",
           f"--workdir={root / 'run'}", f"--config.data.tokenizer={root / 'vocab'}",
           f"--config.data.train_files={root / 'corpus' / 'train.txt'}",
           f"--config.data.eval_files={root / 'corpus' / 'heldout.txt'}",
           "--config.data.text_format=sentences", f"--config.train.steps={steps}",
           f"--config.train.eval_every={steps // 4}", f"--config.train.checkpoint_every={steps // 4}",
           "--config.train.log_every=50"]
    print(f"== 3. pretraining a tiny BERT for {steps} steps (rerun: resumes)")
    _run("train", *run)
    print("== 4. restore the last checkpoint and evaluate it on the held-out modules")
    result = json.loads(_run("eval", *run, "--step=latest").splitlines()[-1])
    print("== 5. pictures: training curves, and attention for one sentence pair")
    curves = json.loads(_run("plot", f"--workdir={root / 'run'}").splitlines()[-1])
    maps = json.loads(_run("attention", f"--checkpoint={root / 'run'}", f"--text={ATTENTION_TEXT[0]}",
                           f"--pair={ATTENTION_TEXT[1]}").splitlines()[-1])

    rows = [r for r in read_metrics(root / "run" / "metrics.jsonl") if "masked_lm_accuracy" in r]
    first, last = rows[0], rows[-1]
    print(f"\n== summary ({time.time() - t0:.0f}s in all)\n"
          f"steps: {last['step']}; MLM accuracy {first['masked_lm_accuracy']:.3f} (step "
          f"{first['step']}) -> {last['masked_lm_accuracy']:.3f} (step {last['step']}); NSP "
          f"accuracy {last['next_sentence_accuracy']:.3f}\n"
          f"held-out (step {result['step']}): MLM accuracy {result['eval/masked_lm_accuracy']:.3f}"
          f", MLM loss {result['eval/masked_lm_loss']:.3f}, NSP accuracy "
          f"{result['eval/next_sentence_accuracy']:.3f}\n"
          f"files: corpus {root / 'corpus'}, vocab {root / 'vocab'}, checkpoints "
          f"{root / 'run' / 'checkpoints'}, metrics {root / 'run' / 'metrics.jsonl'}, eval "
          f"{root / 'run' / 'eval'}\n"
          f"pictures: curves {curves['figure']}, attention {maps['figure']} and {maps['html']} "
          "(open it in a browser: pick the layer and head)")


if __name__ == "__main__":
    from bert_jax.commands import setup_process

    setup_process()
    main(*sys.argv[1:2], *[int(a) for a in sys.argv[2:3]])
