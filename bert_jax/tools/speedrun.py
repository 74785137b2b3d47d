"""The speedrun (`python -m bert_jax.tools.bench speedrun`; docs/speedrun.md).

A fixed CPU-sized task where a recipe change proves itself: the corpus, held-out set and
vocabulary of `bench pretrain` (pretrainbench.py: WikiText-2 + the Gutenberg books, every 20th
document held out, an 8,192-token WordPiece vocab, 512 held-out sequences of 128 tokens masked
once at 15%), one recipe (a config, default configs/modernbert.py:mini, with the user's
overrides) trained for STEPS steps of 32 x 128 rows, its held-out MLM loss scored on every
checkpoint (every EVERY steps) and the training time to TARGET_LOSS interpolated between the two
checkpoints around the crossing (pretrainbench.time_to); the recipe runs its whole schedule (its
decay is part of it), it does not stop at the target. Then readouts: each of SST-2, MRPC and
STS-B fine-tuned from the final checkpoint with one fixed recipe (the GLUE config of the recipe's
family and size, FINETUNE_STEPS steps) for each of SEEDS, scored on dev (the task's main metric:
accuracy, F1, Pearson), median and range.

Each run appends one JSON record to benchmarks/speedrun.jsonl (commit, recipe, overrides, seeds,
tokens and FLOPs up to the target and in all, time to target, final loss, readouts), and
docs/speedrun.md's table is rewritten from that file (`write_table`): never edit it by hand.

TARGET_LOSS, 5.0: the unigram plateau of this held-out set is ~6.78 (predicting each masked token
by its frequency scores 6.728), so 5.0 is ~1.8 nats below it. The modern mini recipe's measured
curve (docs/modernbert.md#time-to-quality, 200 steps, the same rows, about 2 s a step here under
load) left the plateau at step ~60 and fell ~0.18 per 20 steps at full learning rate
(6.52 -> 6.17 from step 100 to 140) and reached 5.84 (5.67 with the 0.02 init) at step 200 after
its decay. STEPS = 1,000 (about 30 minutes at 1-2 s a step on 2 cores) keeps the learning rate
up five times longer; extrapolating that slope, 5.0 falls in the second half of such a run. That
was an extrapolation; the first full run crossed 5.0 at step 377 (docs/speedrun.md). Each record
holds the target it was timed against, so a changed target shows in the table.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from bert_jax import config as config_lib
from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tools import pretrainbench as pb
from bert_jax.training import metrics

log = logging.getLogger(__name__)

TARGET_LOSS = 5.0
RECIPE = "configs/modernbert.py:mini"
STEPS, EVERY, BATCH, SEQ_LEN, EVAL_ROWS = 1000, 50, 32, 128, 512
TASKS = ("sst2", "mrpc", "stsb")
GLUE_FOLDERS = {"sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B"}  # each task's folder of GLUE
SEEDS = (0, 1, 2)
FINETUNE_STEPS = 250
PEER = "HF ModernBertForMaskedLM"
RECORDS = paths.REPO / "benchmarks" / "speedrun.jsonl"
DOC = paths.REPO / "docs" / "speedrun.md"
TABLE_START = "<!-- speedrun table: written by bert_jax/tools/speedrun.py from benchmarks/speedrun.jsonl -->"
TABLE_END = "<!-- end of the speedrun table -->"


def smoke(shared: Path) -> dict[str, Any]:
    """`--smoke`'s arguments of `run`: 2 steps of 8 rows, a checkpoint each, a 600-token vocab
    on two small files, 16 held-out rows, SST-2 only, one seed, 2 fine-tuning steps on 64
    examples: seconds, the harness's own check."""
    text = shared / "text"
    return {"steps": 2, "every": 1, "batch": 8, "eval_rows": 16, "tasks": ("sst2",),
            "seeds": (0,), "finetune_steps": 2, "finetune_overrides": ["data.max_train_examples=64"],
            "files": [text / "wikitext2" / "valid.txt", text / "gutenberg" / "blake-poems.txt"],
            "vocab_size": 600}


def finetune_spec(recipe: str, task: str) -> str:
    """The GLUE config of the recipe's family and size: configs/modernbert.py:mini ->
    configs/glue.py:<task>,modernbert-mini; configs/bert_pretrain.py:mini -> <task>,mini."""
    name, _, size = recipe.rpartition(":")
    family = Path(name).name
    if family == "modernbert.py":
        return f"configs/glue.py:{task},modernbert-{size}"
    if family == "bert_pretrain.py":
        return f"configs/glue.py:{task},{size}"
    raise ValueError(f"speedrun: no fine-tuning recipe for {recipe!r}; give configs/modernbert.py:"
                     "<size> or configs/bert_pretrain.py:<size>")


def check_recipe(recipe: str, peer: bool = False) -> list[str]:
    """The readouts' configs of `recipe` (finetune_spec, for TASKS); ValueError where the recipe
    has none, or `peer` and it is not a configs/modernbert.py recipe (what HF's model mirrors)."""
    specs = [finetune_spec(recipe, task) for task in TASKS]
    if peer and Path(recipe.rpartition(":")[0]).name != "modernbert.py":
        raise ValueError(f"speedrun --peer: HF's ModernBertForMaskedLM mirrors a "
                         f"configs/modernbert.py:<size> recipe, not {recipe!r}")
    return specs


def recipe_overrides(config, corpus: Path, *, steps: int, batch: int, seq_len: int,
                     every: int) -> list[str]:
    """pretrainbench's shared overrides (data, rows, steps, checkpoints), with room for the
    recipe's own masking rate (the predictions a row can hold)."""
    shared = pb.our_overrides("bert2018", corpus, steps=steps, batch=batch, seq_len=seq_len,
                              every=every)
    room = max(round(pb.EVAL_MASKED_LM_PROB * seq_len),
               round(config.data.masked_lm_prob * seq_len) + 1)
    return [o for o in shared if not o.startswith("data.max_predictions_per_seq=")] + [
        f"data.max_predictions_per_seq={room}"]


def training_flops(config, seq_len: int, tokens: float) -> float:
    """The analytic training FLOPs of `tokens` real tokens (models.flops_per_token, as the
    trainer's MFU: 3 x forward), the masked positions estimated at data.masked_lm_prob."""
    f = models.flops_per_token(config.model, seq_len)
    predicted = tokens * config.data.masked_lm_prob
    return 3 * (f["encoder_per_token"] * tokens + f["mlm_head_per_predicted_token"] * predicted)


def commit() -> str:
    """The checkout's commit, "+changes" after it when tracked files differ from it: taken when
    a run starts (the code it imports then is the code that runs)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=paths.REPO, capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def spread(values: list[float]) -> dict[str, Any]:
    """The values and their median and range; a value that is undefined (nan: the correlation
    of constant predictions) is counted in `undefined` and left out of the three."""
    defined = [v for v in values if not np.isnan(v)]
    out = {"values": [round(v, 4) for v in values],
           **{k: round(float(f(defined)), 4) if defined else float("nan")
              for k, f in (("median", np.median), ("min", min), ("max", max))}}
    if len(defined) < len(values):
        out["undefined"] = len(values) - len(defined)
    return out


def readouts(specs: list[str], init_from: Path, glue_dir: Path, workdir: Path, *, tasks, seeds,
             steps: int, overrides: list[str] = ()) -> dict[str, dict]:
    """Each task fine-tuned from `init_from` (its config in `specs`) once per seed: the dev main
    metric's spread."""
    from bert_jax.tasks import scoring

    out = {}
    for task, spec in zip(tasks, specs, strict=True):
        metric = scoring.MAIN_METRIC[task]
        values = []
        for seed in seeds:
            r = pb.finetune("", "", init_from, glue_dir, workdir / f"{task}_seed{seed}",
                            steps=steps, overrides=[f"seed={seed}", *overrides],
                            spec=spec)
            values.append(float(r["eval"][f"eval/{metric}"]))
        out[task] = {"metric": metric, **spread(values)}
    return out


def run(workdir: str, *, recipe: str = RECIPE, overrides: list[str] = (), steps: int = STEPS,
        every: int = EVERY, batch: int = BATCH, seq_len: int = SEQ_LEN, eval_rows: int = EVAL_ROWS,
        tasks: tuple[str, ...] = TASKS, seeds: tuple[int, ...] = SEEDS,
        finetune_steps: int = FINETUNE_STEPS, finetune_overrides: list[str] = (),
        files: list[Path] | None = None, glue_dir: Path | None = None, vocab_size: int = 8192,
        records: Path = RECORDS, label: str = "", peer: bool = False) -> dict[str, Any]:
    """One speedrun in workdir: pretraining (`peer`: HF's ModernBertForMaskedLM with the recipe,
    pretrain_hf_modernbert), scoring, readouts; appends its record to `records`."""
    from bert_jax.training import train

    check_recipe(recipe, peer)  # refused now, not after pretraining
    code = commit()  # (now: the checkout may change while the run goes on)
    read_records(records)  # (a damaged records file: said now, not when the record is appended)
    specs = [finetune_spec(recipe, task) for task in tasks]
    work = Path(workdir)
    shared = paths.shared_data()
    corpus_dir = work / "corpus"
    # The recipe with the user's overrides, and the readouts' data, checked before any work
    # (the corpus and vocabulary take minutes, the pretraining half an hour).
    # A config file of the user's (from where they run) or the repository's configs/.
    spec = recipe if Path(recipe.rpartition(":")[0] or recipe).is_file() else str(paths.REPO / recipe)
    given = list(overrides)
    base = config_lib.load(spec, given)
    shape = {"steps": steps, "batch": batch, "seq_len": seq_len, "every": every}
    config = config_lib.load(spec, recipe_overrides(base, corpus_dir, **shape) + given)
    glue = glue_dir or shared / "glue"
    if missing := [t for t in tasks if not (glue / GLUE_FOLDERS[t] / "train.tsv").is_file()]:
        raise FileNotFoundError(f"--glue={glue}: no {GLUE_FOLDERS[missing[0]]}/train.tsv there (the "
                                f"readouts fine-tune {', '.join(tasks)}); give the GLUE folder")
    pb.build_corpus(files or pb.source_files(shared), corpus_dir, vocab_size=vocab_size)
    tokenizer = tokenizer_lib.load_tokenizer(corpus_dir / "vocab")
    evalset = pb.heldout_set(corpus_dir / "heldout.txt", tokenizer, rows=eval_rows, seq_len=seq_len)
    run_dir = work / ("pretrain_hf" if peer else "pretrain")
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    if peer:
        hf = pretrain_hf_modernbert(config, corpus_dir, run_dir, **shape)
        from transformers import ModernBertForMaskedLM

        timeline = hf["timeline"]
        scores = pb.score_hf(hf["folders"], evalset, model_class=ModernBertForMaskedLM)
        init_from = pb.convert_hf(hf["folders"][max(hf["folders"])], work / "hf_converted")
    else:
        train.train_and_evaluate(config, str(run_dir))
        timeline, init_from = pb._timeline(run_dir), run_dir
        scores = pb.score_ours(run_dir, sorted(timeline), evalset)
    process_s = time.perf_counter() - t0
    for step, s in scores.items():
        timeline[step].update(s)
    points = sorted(timeline.items())
    to = {clock: pb.time_to([(p[clock], p["heldout_mlm_loss"]) for _, p in points], TARGET_LOSS)
          for clock in ("train_s", "wall_s")}
    step_to = pb.time_to([(s, p["heldout_mlm_loss"]) for s, p in points], TARGET_LOSS)
    per_step = float(np.mean([p["tokens_per_step"] for _, p in points]))
    last = points[-1][0]
    reads = readouts(specs, init_from, glue, work, tasks=tasks, seeds=seeds, steps=finetune_steps,
                     overrides=list(finetune_overrides))
    tokens_to = None if step_to is None else step_to * per_step
    record = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "commit": code, "label": label, "recipe": recipe,
        "trainer": PEER if peer else "bert_jax", "overrides": given,
        "steps": last, "rows": f"{batch} x {seq_len}", "target_loss": TARGET_LOSS,
        "seeds": list(seeds), "pretrain_seed": config.seed, "cpu_count": os.cpu_count(),
        "tokens": round(per_step * last), "flops": training_flops(config, seq_len, per_step * last),
        "step_to_target": None if step_to is None else round(step_to, 1),
        "tokens_to_target": None if tokens_to is None else round(tokens_to),
        "flops_to_target": None if tokens_to is None else training_flops(config, seq_len, tokens_to),
        "time_to_target_s": None if to["train_s"] is None else round(to["train_s"], 1),
        "wall_to_target_s": None if to["wall_s"] is None else round(to["wall_s"], 1),
        "final_heldout_loss": round(points[-1][1]["heldout_mlm_loss"], 4),
        "best_heldout_loss": round(min(p["heldout_mlm_loss"] for _, p in points), 4),
        "readouts": reads, "finetune_steps": finetune_steps, "process_s": round(process_s, 1),
        "curve": {str(s): [round(p["train_s"], 1), round(p["heldout_mlm_loss"], 4)] for s, p in points},
    }
    append_record(record, records)
    return record


def pretrain_hf_modernbert(config, corpus: Path, workdir: Path, *, steps: int, batch: int,
                           seq_len: int, every: int, seed: int = 0) -> dict:
    """The peer: HF PyTorch ModernBertForMaskedLM of `config`'s model (its config.json as our
    export writes it; sdpa attention, loss at the masked positions only), one document piece a
    row (`[CLS]` up to seq_len - 2 tokens `[SEP]`, shuffled, padded: HF's sdpa path packs
    nothing), masked afresh each step at the recipe's rate by the project's masking (80/10/10),
    torch AdamW (StableAdamW has no torch release) with the recipe's lr, betas, eps and weight
    decay, transformers' get_wsd_schedule with the recipe's warmup and decay fraction (1-sqrt);
    save_pretrained every `every` steps. Its timeline as pretrainbench's."""
    import torch
    import transformers

    from bert_jax.data import pretraining
    from bert_jax.interop import families

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(seed)
    tokenizer = tokenizer_lib.load_tokenizer(corpus / "vocab")
    pieces = [p for doc in pretraining.iter_documents(corpus / "train.txt", "sentences")
              for p in pretraining.document_pieces(pretraining.tokenize_document(doc, tokenizer),
                                                   seq_len - 2) if len(p)]
    t_start = time.perf_counter()
    cfg = models.split_model_config(config_lib.model_config(config))[1]
    hf = families.get("modernbert").config_to_hf(config.model.name, cfg, {
        "pad": tokenizer.pad_id, "cls": tokenizer.cls_id, "sep": tokenizer.sep_id})
    hf_config = transformers.ModernBertConfig(**{k: v for k, v in hf.items() if k != "architectures"})
    hf_config.sparse_prediction = True
    hf_config._attn_implementation = "sdpa"
    model = transformers.ModernBertForMaskedLM(hf_config).train()
    o, sched = config.optimizer, config.schedule
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.learning_rate, betas=(o.b1, o.b2),
                                  eps=o.eps, weight_decay=o.weight_decay)
    schedule = transformers.get_wsd_schedule(
        optimizer, sched.warmup_steps, round(sched.decay_fraction * steps),
        num_training_steps=steps, decay_type=sched.decay_shape)
    rng = np.random.default_rng(seed)
    P = config.data.max_predictions_per_seq
    mask = {"vocab_size": tokenizer.vocab_size, "special_ids": tokenizer.special_ids,
            "mask_id": tokenizer.mask_id, "max_predictions_per_seq": P,
            "masked_lm_prob": config.data.masked_lm_prob}
    init_s = time.perf_counter() - t_start
    timeline, folders, order, train_s, tokens = {}, {}, [], 0.0, 0
    for step in range(1, steps + 1):
        t = time.perf_counter()
        if len(order) < batch:  # a new epoch, reshuffled; the last partial batch dropped
            order = list(rng.permutation(len(pieces)))
        rows, order = order[:batch], order[batch:]
        f = [pretraining.pad_features(pretraining.sequence_features(
            pieces[i], cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, max_seq_length=seq_len,
            rng=rng, **mask), seq_len, P) for i in rows]
        b = {k: torch.from_numpy(np.stack([x[k] for x in f]).astype(np.int64))
             for k in ("input_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids")}
        weights = torch.from_numpy(np.stack([x["masked_lm_weights"] for x in f]))
        labels = torch.full_like(b["input_ids"], -100)
        labels.scatter_(1, b["masked_lm_positions"],
                        torch.where(weights > 0, b["masked_lm_ids"], -100))
        loss = pb.torch_step(model, optimizer, schedule, {
            "input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "labels": labels},
            o.grad_clip_norm)
        tokens += int(b["attention_mask"].sum())
        train_s += time.perf_counter() - t
        if step % every == 0 or step == steps:
            folders[step] = workdir / f"step_{step}"
            model.save_pretrained(folders[step])
            timeline[step] = {"train_s": train_s, "wall_s": init_s + train_s,
                              "tokens_per_step": tokens / step, "train_loss": float(loss.detach())}
    for name in (corpus / "vocab").iterdir():  # our WordPiece files: `convert` reads them
        shutil.copy(name, folders[steps] / name.name)
    return {"timeline": timeline, "folders": folders}


def append_record(record: dict, records: Path) -> None:
    records.parent.mkdir(parents=True, exist_ok=True)
    with open(records, "a") as f:
        f.write(metrics.json_dumps(record) + "\n")


# The keys render_table reads of each record, with the type of those it formats as numbers.
_RECORD_KEYS = {"recipe": str, "overrides": list, "commit": str, "target_loss": float,
                "steps": int, "final_heldout_loss": float, "readouts": dict, "date": str}
_MAYBE_NONE = ("time_to_target_s", "step_to_target", "tokens_to_target", "flops_to_target")


def read_records(records: Path) -> list[dict]:
    """The records of a speedrun.jsonl; a line that is not one (edited by hand, cut short) is a
    ValueError naming the file, line and key."""
    if not records.is_file():
        return []
    out = []
    for n, line in enumerate(records.read_text().splitlines(), 1):
        if not line.strip():
            continue
        what = "each line is one speedrun's record, as `bench speedrun` appends it: fix or remove it"
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{records}:{n}: not a JSON line ({e}); {what}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{records}:{n}: a JSON {type(record).__name__}, not a record; {what}")
        for key, kind in _RECORD_KEYS.items():
            paths.json_field(record, key, kind, f"{records}:{n}", what)
        for key in _MAYBE_NONE:
            if record.get(key, 0) is not None:
                paths.json_field(record, key, float, f"{records}:{n}", what)
        out.append(record)
    return out


def render_table(records: list[dict]) -> str:
    """The markdown table of the records, fastest time to target first (not reached: last)."""
    head = ("| recipe | overrides | commit | target | steps | time to target (s) | step at target | "
            "tokens to target | FLOPs to target | final held-out loss | "
            + " | ".join(f"{t}: median [min, max]" for t in TASKS) + " | date |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---|" * len(TASKS) + "---|"]

    def num(x, spec):
        return "not reached" if x is None else format(x, spec)

    def key(r):
        t = r.get("time_to_target_s")
        return (t is None, t or 0.0)
    for r in sorted(records, key=key):
        reads = [r["readouts"].get(t) for t in TASKS]
        # (float(): a nan median or range is stored as "nan", as metrics.jsonl stores it)
        cells = ["-" if x is None else "{} {:.3f} [{:.3f}, {:.3f}]".format(
            x["metric"], *(float(x[k]) for k in ("median", "min", "max"))) for x in reads]
        name = r["recipe"] + (f" ({r['label']})" if r.get("label") else "")
        name = f"{r['trainer']}: {name}" if r.get("trainer", "bert_jax") != "bert_jax" else name
        lines.append(
            f"| {name} | {' '.join(f'`{o}`' for o in r['overrides']) or '-'} | {r['commit'][:8]} | "
            f"{r['target_loss']:.2f} | {r['steps']} | {num(r['time_to_target_s'], '.0f')} | "
            f"{num(r['step_to_target'], '.0f')} | {num(r['tokens_to_target'], ',.0f')} | "
            f"{num(r['flops_to_target'], '.3g')} | {r['final_heldout_loss']:.3f} | "
            + " | ".join(cells) + f" | {r['date']} |")
    if not records:
        lines.append("| (no runs recorded yet) |" + " |" * (9 + len(TASKS) + 1))
    return "\n".join(lines)


def write_table(doc: Path = DOC, records: Path = RECORDS) -> str:
    """Rewrites the table between TABLE_START and TABLE_END in `doc` from `records`."""
    text = doc.read_text()
    pattern = re.compile(re.escape(TABLE_START) + r".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{doc}: no speedrun table markers ({TABLE_START} ... {TABLE_END})")
    table = render_table(read_records(records))
    doc.write_text(pattern.sub(lambda _: f"{TABLE_START}\n{table}\n{TABLE_END}", text))
    return table
