"""Peer baselines for `make bench`: the same training workloads run with HF transformers.

This script is the *other side* of the benchmark: it never imports bert_jax. It runs
HF transformers' BERT (PyTorch `BertFor*` and Flax `FlaxBertFor*`) on the workloads that
bert_jax's benchmark runs, so the two sets of numbers can be printed side by side.

Environment
-----------
It runs in its own virtualenv, `.venv-peers` at the repository root, pinned by
`benchmarks/requirements-peers.txt` (transformers 4.57.6, the last release with Flax
models, plus a CPU torch and jax/flax/optax)::

    python3 -m venv .venv-peers
    .venv-peers/bin/pip install -r benchmarks/requirements-peers.txt
    .venv-peers/bin/python benchmarks/peers.py pretrain --framework flax ...

Imports are limited to numpy, torch, transformers and jax/flax/optax; torch is imported
only for `--framework torch` and jax only for `--framework flax`. Every subcommand prints
exactly one JSON object, on the last line of stdout (logs and warnings go to stderr).

Workloads
---------
pretrain
    BertForPreTraining (torch) / FlaxBertForPreTraining (flax), randomly initialised from
    a BertConfig of the given shape (max_position_embeddings 512, type_vocab_size 2,
    dropout 0.1, train mode). One fixed synthetic batch (numpy seed 0): random token ids,
    full length with no padding (attention mask all ones), segment ids 0 for the first
    half and 1 for the second, MLM labels at 20 random distinct positions per sequence,
    random NSP labels. Loss = MLM cross-entropy (mean over the 20 positions) + NSP
    cross-entropy. torch: labels -100 elsewhere, `torch.optim.AdamW`. flax: the MLM loss
    is computed from the full logits with a weights mask, as HF's Flax `run_mlm_flax.py`
    does, and a jitted train step returns new params and optimizer state (`optax.adamw`;
    params and optimizer state donated). Both: lr 1e-4, weight decay 0.01 on all params,
    betas (0.9, 0.999), eps 1e-8. `--warmup` steps run first (compilation, allocator
    warm-up), then `--steps` steps are timed; each step waits for its result (torch is
    synchronous; jax: `block_until_ready` on the loss). torch uses
    `torch.set_num_threads(os.cpu_count())`, i.e. all cores, as XLA:CPU does.
    Output: tokens_per_s = batch * seq * steps / seconds, step_s = seconds / steps.

finetune (GLUE SST-2)
    BertForSequenceClassification (num_labels 2, dropout 0.1) randomly initialised, with
    vocab size = the line count of `--vocab_dir/vocab.txt`, tokenised by
    `BertTokenizerFast(vocab_file=..., do_lower_case=True)` with truncation at
    `--max_seq_length`. Training examples are tokenised up front (as `datasets.map` would),
    shuffled with `--seed` (reshuffled each epoch, last partial batch dropped), and each
    batch is padded only to its own longest example (`DataCollatorWithPadding`: dynamic
    padding). AdamW (weight decay `--weight_decay`), gradient clipping at 1.0 and
    `get_linear_schedule_with_warmup` over `--steps` (warmup = warmup_ratio * steps), as
    HF's Trainer does. The whole training loop, batch collation included, is timed
    excluding its first 5 steps; examples_per_s = batch * (steps - 5) / seconds. Then
    accuracy on the whole dev file.
    `--framework flax`: FlaxBertForSequenceClassification with a jitted train step
    (optax chain of clip_by_global_norm(1.0) and adamw with the same linear schedule).
    Dynamic padding would recompile for every new length, so batches are padded to a
    multiple of 16 instead (`padding` in the JSON says so) and the train step is compiled
    ahead of time for every bucket length the batches use, before the timed loop
    (`compile_s`, `compiled_lengths`).

TSV files have a header line with `sentence` and `label` columns (GLUE's SST-2 format).
"""

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time

import numpy as np


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def versions(framework):
    names = ["numpy", "transformers", "tokenizers"]
    names += ["torch"] if framework == "torch" else ["jax", "jaxlib", "flax", "optax"]
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def emit(obj):
    print(json.dumps(obj), flush=True)


# --------------------------------------------------------------------------- pretrain


def synthetic_pretrain_batch(args):
    rng = np.random.default_rng(0)
    b, s, v = args.batch, args.seq, args.vocab
    if args.masked > s:
        raise SystemExit("--masked must be <= --seq")
    # Ids 5.. avoid the usual special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]).
    input_ids = rng.integers(5, v, size=(b, s), dtype=np.int64)
    attention_mask = np.ones((b, s), np.int64)
    token_type_ids = np.zeros((b, s), np.int64)
    token_type_ids[:, s // 2:] = 1
    mlm_labels = np.full((b, s), -100, np.int64)
    for i in range(b):
        pos = rng.choice(s, size=args.masked, replace=False)
        mlm_labels[i, pos] = rng.integers(5, v, size=args.masked)
    nsp_labels = rng.integers(0, 2, size=(b,), dtype=np.int64)
    return input_ids, attention_mask, token_type_ids, mlm_labels, nsp_labels


def bert_config(args, vocab_size, **kw):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.mlp,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        **kw,
    )


def time_steps(step, warmup, steps):
    """Runs `warmup` untimed then `steps` timed calls of step() (each returns a float loss)."""
    loss = None
    for i in range(warmup):
        t = time.perf_counter()
        loss = step()
        log(f"warmup step {i}: loss {loss:.4f} ({time.perf_counter() - t:.2f}s)")
    times = []
    t0 = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
        log(f"step {i}: loss {loss:.4f} ({times[-1]:.2f}s)")
    return time.perf_counter() - t0, times, loss


def pretrain_torch(args, batch):
    import torch
    from transformers import BertForPreTraining

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config(args, args.vocab))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    ids, mask, types, mlm, nsp = (torch.from_numpy(x) for x in batch)
    n_params = sum(p.numel() for p in model.parameters())
    autocast = args.dtype == "bfloat16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=ids, attention_mask=mask, token_type_ids=types,
                        labels=mlm, next_sentence_label=nsp)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    extra = {"threads": torch.get_num_threads()}
    if autocast:
        extra["dtype_note"] = "torch.autocast(cpu, bfloat16); fp32 master weights"
    return step, n_params, extra


def pretrain_flax(args, batch):
    import jax
    import jax.numpy as jnp
    import optax
    from transformers import FlaxBertForPreTraining

    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    model = FlaxBertForPreTraining(bert_config(args, args.vocab), input_shape=(1, args.seq),
                                   seed=0, dtype=dtype)
    params = model.params
    tx = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
    opt_state = tx.init(params)
    ids, mask, types, mlm, nsp = (jnp.asarray(x, jnp.int32) for x in batch)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))

    def loss_fn(params, dropout_rng):
        out = model(ids, attention_mask=mask, token_type_ids=types, params=params,
                    dropout_rng=dropout_rng, train=True)
        logits = out.prediction_logits.astype(jnp.float32)
        # As run_mlm_flax.py: cross-entropy over the full logits, weighted by a label mask.
        label_mask = jnp.where(mlm > 0, 1.0, 0.0)
        mlm_loss = optax.softmax_cross_entropy(
            logits, jax.nn.one_hot(mlm, logits.shape[-1])) * label_mask
        mlm_loss = mlm_loss.sum() / label_mask.sum()
        nsp_logits = out.seq_relationship_logits.astype(jnp.float32)
        nsp_loss = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp).mean()
        return mlm_loss + nsp_loss

    def train_step(params, opt_state, rng):
        rng, dropout_rng = jax.random.split(rng)
        loss, grads = jax.value_and_grad(loss_fn)(params, dropout_rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, rng, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1, 2))
    state = {"params": params, "opt": opt_state, "rng": jax.random.PRNGKey(0)}

    def step():
        state["params"], state["opt"], state["rng"], loss = train_step(
            state["params"], state["opt"], state["rng"])
        return float(loss.block_until_ready())

    extra = {"devices": [str(d) for d in jax.devices()]}
    return step, n_params, extra


def cmd_pretrain(args):
    batch = synthetic_pretrain_batch(args)
    make = pretrain_torch if args.framework == "torch" else pretrain_flax
    step, n_params, extra = make(args, batch)
    seconds, times, loss = time_steps(step, args.warmup, args.steps)
    emit({
        "peer": "hf_" + args.framework,
        "workload": "pretrain",
        "tokens_per_s": args.batch * args.seq * args.steps / seconds,
        "step_s": seconds / args.steps,
        "step_s_median": float(np.median(times)),
        "seconds": seconds,
        "steps": args.steps,
        "warmup": args.warmup,
        "final_loss": loss,
        "shape": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                  "mlp": args.mlp, "seq": args.seq, "batch": args.batch,
                  "vocab": args.vocab, "masked_per_seq": args.masked},
        "dtype": args.dtype,
        "params": int(n_params),
        "cpu_count": os.cpu_count(),
        "versions": versions(args.framework),
        **extra,
    })


# --------------------------------------------------------------------------- finetune


def read_tsv(path):
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        si, li = header.index("sentence"), header.index("label")
        sentences, labels = [], []
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            cols = line.split("\t")
            sentences.append(cols[si])
            labels.append(int(cols[li]))
    return sentences, np.asarray(labels, np.int64)


def tokenize(tokenizer, sentences, labels, max_len):
    enc = tokenizer(sentences, truncation=True, max_length=max_len)
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    return [dict({k: enc[k][i] for k in keys}, labels=int(labels[i]))
            for i in range(len(sentences))]


def train_batches(n, batch, steps, seed):
    """Index arrays for `steps` batches: shuffled epochs (seeded), last partial batch dropped."""
    rng = np.random.default_rng(seed)
    per_epoch = n // batch
    if per_epoch == 0:
        raise SystemExit("fewer training examples than --batch")
    out = []
    while len(out) < steps:
        perm = rng.permutation(n)
        out += [perm[i * batch:(i + 1) * batch] for i in range(per_epoch)]
    return out[:steps]


def finetune_torch(args, tokenizer, config, train, dev, batches):
    import torch
    from transformers import (
        BertForSequenceClassification,
        DataCollatorWithPadding,
        get_linear_schedule_with_warmup,
    )

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification(config)
    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, int(args.warmup_ratio * args.steps),
                                            args.steps)
    model.train()
    padded, t0, loss = [], None, None
    for i, idx in enumerate(batches):
        if i == args.skip_steps:
            t0 = time.perf_counter()
        b = collate([train[j] for j in idx])
        padded.append(b["input_ids"].shape[1])
        out = model(**b)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        if i % 25 == 0 or i == len(batches) - 1:
            log(f"step {i}: loss {loss:.4f} len {padded[-1]}")
    train_s = time.perf_counter() - t0

    model.eval()
    t = time.perf_counter()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(dev), args.eval_batch):
            b = collate(dev[s:s + args.eval_batch])
            labels = b.pop("labels")
            pred = model(**b).logits.argmax(-1)
            correct += int((pred == labels).sum())
    eval_s = time.perf_counter() - t
    extra = {"threads": torch.get_num_threads(),
             "padding": "dynamic (each batch padded to its longest example)"}
    return train_s, eval_s, padded, correct, loss, extra


def finetune_flax(args, tokenizer, config, train, dev, batches):
    import jax
    import jax.numpy as jnp
    import optax
    from transformers import FlaxBertForSequenceClassification

    mult = 16
    # The padded lengths the training batches will have (known up front: the order is fixed).
    buckets = sorted({-(-max(len(train[j]["input_ids"]) for j in idx) // mult) * mult
                      for idx in batches})

    def collate(examples):
        b = tokenizer.pad([{k: v for k, v in e.items() if k != "labels"} for e in examples],
                          padding=True, pad_to_multiple_of=mult, return_tensors="np")
        b = {k: jnp.asarray(v, jnp.int32) for k, v in b.items()}
        return b, jnp.asarray([e["labels"] for e in examples], jnp.int32)

    model = FlaxBertForSequenceClassification(config, input_shape=(1, mult), seed=args.seed)
    warm = int(args.warmup_ratio * args.steps)
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, args.lr, max(warm, 1)),
         optax.linear_schedule(args.lr, 0.0, max(args.steps - warm, 1))], [warm])
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, weight_decay=args.weight_decay))
    params = model.params
    opt_state = tx.init(params)

    def train_step(params, opt_state, rng, batch, labels):
        rng, dropout_rng = jax.random.split(rng)

        def loss_fn(p):
            logits = model(**batch, params=p, dropout_rng=dropout_rng, train=True).logits
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rng, loss

    def eval_step(params, batch):
        return model(**batch, params=params, train=False).logits.argmax(-1)

    jit_train = jax.jit(train_step, donate_argnums=(0, 1, 2))
    jit_eval = jax.jit(eval_step)
    rng = jax.random.PRNGKey(args.seed)

    # Compile the train step for every bucket length used, up front (not timed).
    t = time.perf_counter()
    compiled = {}
    for n in buckets:
        z = jnp.zeros((args.batch, n), jnp.int32)
        batch = {"input_ids": z, "token_type_ids": z, "attention_mask": z}
        compiled[n] = jit_train.lower(params, opt_state, rng, batch,
                                      jnp.zeros((args.batch,), jnp.int32)).compile()
    compile_s = time.perf_counter() - t
    log(f"compiled {len(buckets)} bucket lengths in {compile_s:.1f}s")

    padded, t0, loss = [], None, None
    for i, idx in enumerate(batches):
        if i == args.skip_steps:
            t0 = time.perf_counter()
        batch, labels = collate([train[j] for j in idx])
        n = batch["input_ids"].shape[1]
        padded.append(n)
        params, opt_state, rng, loss = compiled[n](params, opt_state, rng, batch, labels)
        loss = float(loss.block_until_ready())
        if i % 25 == 0 or i == len(batches) - 1:
            log(f"step {i}: loss {loss:.4f} len {n}")
    train_s = time.perf_counter() - t0

    t = time.perf_counter()
    correct = 0
    for s in range(0, len(dev), args.eval_batch):
        batch, labels = collate(dev[s:s + args.eval_batch])
        correct += int((jit_eval(params, batch) == labels).sum())
    eval_s = time.perf_counter() - t
    extra = {"padding": f"each batch padded to its longest example rounded up to a "
                        f"multiple of {mult} (one compiled step per length)",
             "compile_s": compile_s, "compiled_lengths": buckets, "devices": [str(d) for d in jax.devices()]}
    return train_s, eval_s, padded, correct, loss, extra


def cmd_finetune(args):
    from transformers import BertTokenizerFast

    vocab_file = os.path.join(args.vocab_dir, "vocab.txt")
    with open(vocab_file, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    tokenizer = BertTokenizerFast(vocab_file=vocab_file, do_lower_case=True)
    config = bert_config(args, vocab_size, num_labels=2)

    t = time.perf_counter()
    train_s_, train_y = read_tsv(args.train)
    dev_s, dev_y = read_tsv(args.dev)
    train = tokenize(tokenizer, train_s_, train_y, args.max_seq_length)
    dev = tokenize(tokenizer, dev_s, dev_y, args.max_seq_length)
    tokenize_s = time.perf_counter() - t
    log(f"{len(train)} train / {len(dev)} dev examples tokenised in {tokenize_s:.1f}s")
    if args.steps <= args.skip_steps:
        raise SystemExit("--steps must exceed the untimed first steps")
    batches = train_batches(len(train), args.batch, args.steps, args.seed)

    run = finetune_torch if args.framework == "torch" else finetune_flax
    train_s, eval_s, padded, correct, loss, extra = run(
        args, tokenizer, config, train, dev, batches)
    timed = args.steps - args.skip_steps
    real = [len(train[j]["input_ids"]) for idx in batches for j in idx]
    emit({
        "peer": "hf_" + args.framework,
        "workload": "finetune_sst2",
        "examples_per_s": args.batch * timed / train_s,
        "padded_tokens_per_s": args.batch * sum(padded[args.skip_steps:]) / train_s,
        "dev_accuracy": correct / len(dev),
        "dev_examples": len(dev),
        "steps": args.steps,
        "timed_steps": timed,
        "train_seconds": train_s,
        "eval_seconds": eval_s,
        "tokenize_seconds": tokenize_s,
        "final_loss": loss,
        "batch": args.batch,
        "lr": args.lr,
        "warmup_ratio": args.warmup_ratio,
        "weight_decay": args.weight_decay,
        "max_seq_length": args.max_seq_length,
        "mean_padded_length": float(np.mean(padded)),
        "mean_real_length": float(np.mean(real)),
        "shape": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                  "mlp": args.mlp, "vocab": vocab_size},
        "seed": args.seed,
        "cpu_count": os.cpu_count(),
        "versions": versions(args.framework),
        **extra,
    })


# --------------------------------------------------------------------------- CLI


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def shape(sp, layers=None, hidden=None, heads=None, mlp=None):
        sp.add_argument("--framework", choices=["torch", "flax"], required=True)
        sp.add_argument("--layers", type=int, required=layers is None, default=layers)
        sp.add_argument("--hidden", type=int, required=hidden is None, default=hidden)
        sp.add_argument("--heads", type=int, required=heads is None, default=heads)
        sp.add_argument("--mlp", type=int, required=mlp is None, default=mlp)

    pt = sub.add_parser("pretrain", help="BERT MLM+NSP pretraining steps on synthetic data")
    shape(pt)
    pt.add_argument("--seq", type=int, default=128)
    pt.add_argument("--batch", type=int, required=True)
    pt.add_argument("--steps", type=int, default=10)
    pt.add_argument("--warmup", type=int, default=3)
    pt.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    pt.add_argument("--vocab", type=int, default=30522)
    pt.add_argument("--masked", type=int, default=20, help="MLM positions per sequence")

    ft = sub.add_parser("finetune", help="GLUE SST-2 fine-tuning from random init")
    shape(ft, 6, 384, 6, 1536)
    ft.add_argument("--vocab_dir", required=True)
    ft.add_argument("--train", required=True)
    ft.add_argument("--dev", required=True)
    ft.add_argument("--batch", type=int, default=32)
    ft.add_argument("--eval_batch", type=int, default=64)
    ft.add_argument("--steps", type=int, default=250)
    ft.add_argument("--lr", type=float, default=5e-5)
    ft.add_argument("--warmup_ratio", type=float, default=0.1)
    ft.add_argument("--weight_decay", type=float, default=0.01)
    ft.add_argument("--max_seq_length", type=int, default=128)
    ft.add_argument("--seed", type=int, default=0)
    ft.add_argument("--skip_steps", type=int, default=5, help="first steps left out of timing")

    args = p.parse_args(argv)
    {"pretrain": cmd_pretrain, "finetune": cmd_finetune}[args.cmd](args)


if __name__ == "__main__":
    main()
