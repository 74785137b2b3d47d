"""`bert-jax convert`, `export`, `features`, `embed`, `mine` and `eval-embeddings`: public
checkpoints in, Hugging Face folders out, contextual token vectors, sentence vectors, hard
negatives mined with them and their scores."""

from __future__ import annotations

import dataclasses
import json
import logging

from absl import app

from bert_jax import paths
from bert_jax.commands.options import (
    BATCH_SIZE,
    BEIR,
    BM25,
    BOOTSTRAP,
    CHECKPOINT,
    CORPUS,
    HEAD,
    INPUT,
    LAYERS,
    MAX_SEQ_LENGTH,
    NEGATIVES,
    OUTPUT,
    POOLING,
    SHARD_SIZE,
    SPLIT,
    SQUAD,
    STEP,
    STS,
    list_items,
    maybe_initialize_distributed,
    require,
)


def _check_arguments(source: str, out: str, command: str) -> None:
    """convert's and export's two paths, as the command table checks path flags: a bad one is
    a bad argument, an <out_dir> named like a file, or that is a file (or inside one), an error."""
    for value, what in ((source, "<source>"), (out, "<out_dir>")):
        try:
            paths.check_given(value, what)
        except ValueError as e:
            raise app.UsageError(str(e)) from None
    paths.output_kind(out, "<out_dir>", command, other="folder")
    paths.check_output(out, "<out_dir>", "folder")


def _check_source_not_a_file(source: str) -> None:
    """convert reads a folder (tf: also a checkpoint prefix, which is no file): one of its
    files given instead is named as such, with the folder that holds it."""
    scheme, where = source[:3], source[3:]
    if paths.is_remote(where) or not paths.path(where).is_file():
        return
    file = paths.path(where)
    if scheme == "tf:" and (file.suffix == ".index" or ".data-" in file.name):
        fix = f"tf:{file.parent / file.name.split('.index')[0].split('.data-')[0]} (the prefix)"
    else:
        fix = f"{scheme}{file.parent} (the folder that holds it)"
    raise NotADirectoryError(f"<source>={source} is a file, not a folder (a file where a folder is "
                             f"needed); convert reads the model's folder: give {fix}")


def cmd_convert(args: list[str]) -> None:
    """Converts a public checkpoint into a bert_jax checkpoint directory."""
    from bert_jax.interop import convert

    if len(args) != 2 or not args[0].startswith(("hf:", "tf:", "st:")):
        raise app.UsageError("usage: bert-jax convert hf:<huggingface_dir> <out_dir>, "
                             "tf:<original TF checkpoint folder or prefix> <out_dir>, or "
                             "st:<sentence-transformers folder> <out_dir>")
    _check_arguments(args[0][3:], args[1], "convert")
    _check_source_not_a_file(args[0])
    if args[0].startswith("st:"):
        from bert_jax.interop import sentence_models

        if HEAD.value is not None:  # the sentence model is the bare encoder
            raise app.UsageError(f"--head={HEAD.value} would do nothing with an st: source: "
                                 "convert st: makes the sentence model's bare encoder (with its "
                                 "pooling); --head chooses the head of an hf: or tf: source")

        report = sentence_models.convert_st(args[0][3:], args[1])
        print(f"converted {args[0]} -> {report['out']} as a sentence model "
              f"({json.dumps(report['sentence'])})")
        return
    report = convert.convert_hf(args[0][3:], args[1], HEAD.value)
    print(f"converted {args[0]} -> {report['out']} as {report['model']}")
    if report["missing"]:
        print("not in the checkpoint (freshly initialised): " + ", ".join(report["missing"]))
    if report["unused"]:
        print("in the checkpoint but unused by this model: " + ", ".join(report["unused"]))


def cmd_export(args: list[str]) -> None:
    """Writes a checkpoint (a convert output or a training workdir) as a Hugging Face folder."""
    from bert_jax.interop import export

    if len(args) != 2 or not args[1].startswith(("hf:", "st:")):
        raise app.UsageError("usage: bert-jax export <checkpoint_dir> hf:<out_dir> (or "
                             "st:<out_dir>, a sentence-transformers folder)")
    _check_arguments(args[0], args[1][3:], "export")
    if wrong := paths.wrong_kind(args[0], "<checkpoint_dir>", ("run", "folder"), "a checkpoint (a "
                                 "training run's folder or a `bert-jax convert` output)", step_flag=True):
        raise ValueError(wrong)
    if STEP.value != "latest" and not STEP.value.isdigit():
        raise app.UsageError(f"--step={STEP.value!r}: export takes latest or a step number")
    step = None if STEP.value == "latest" else int(STEP.value)
    if args[1].startswith("st:"):
        from bert_jax.interop import sentence_models

        report = sentence_models.export_st(args[0], args[1][3:], step)
        print(f"exported {args[0]} -> {report['out']} as a sentence-transformers folder "
              f"({json.dumps(report['sentence'])})")
        return
    report = export.export_hf(args[0], args[1][3:], step)
    print(f"exported {args[0]} -> {report['out']} as {report['architecture']}"
          + ("" if report["tokenizer"] else " (no tokenizer files)"))


def cmd_features(args: list[str]) -> None:
    """Writes contextual token vectors of chosen layers, one JSON line per input line."""
    from bert_jax.interop import features

    try:
        layers = list_items("--layers", [LAYERS.value], int)
    except ValueError:
        raise app.UsageError(f"--layers={LAYERS.value!r}: expected integers like -1,-2") from None
    n = features.extract_features(
        require(CHECKPOINT, "features"), require(INPUT, "features"),
        require(OUTPUT, "features"), layers=layers if LAYERS.present else None,
        max_seq_length=MAX_SEQ_LENGTH.value, batch_size=8 if BATCH_SIZE.value is None else BATCH_SIZE.value)
    print(json.dumps({"lines": n, "output": OUTPUT.value, "layers": layers}))


def cmd_embed(args: list[str]) -> None:
    """Writes one sentence vector per input line (a .npy array [lines, hidden]), pooled as the
    checkpoint's sentence_model.json says (`convert st:`; without one, the [CLS] vector); with a
    folder as --output, a corpus (text lines or a BEIR corpus.jsonl) as shards of vectors with
    their ids, over every device and host, resumed by running the same command again."""
    import numpy as np

    from bert_jax import paths
    from bert_jax.data import text
    from bert_jax.interop import sentence_models

    source, output = require(CHECKPOINT, "embed"), require(OUTPUT, "embed")
    if args:
        raise app.UsageError(f"embed takes no arguments (got {args}); use --input and --output")
    # (--output's name: a .npy file or a folder, checked with the command's other outputs)
    maybe_initialize_distributed("embed")  # several hosts: each embeds its shards
    if not output.endswith(".npy"):
        from bert_jax.interop import bulk_embed

        report = bulk_embed.embed_to_shards(
            source, require(INPUT, "embed"), output, shard_size=SHARD_SIZE.value,
            batch_size=BATCH_SIZE.value or 32, spec=_sentence_spec(source))
        print(json.dumps(report))
        return
    import jax

    if jax.process_count() > 1:
        raise ValueError(f"--output={output}: a .npy --output is one process's, and this is one of "
                         f"{jax.process_count()}; give a folder as --output (shards, each host its own)")
    paths.check_new_file(output, "--output", "embed")
    given = require(INPUT, "embed")
    if given.removesuffix(".gz").endswith(".jsonl"):  # its lines would be embedded as JSON text
        raise ValueError(f"--input={given}: a corpus of JSON lines embeds into a folder of shards "
                         "with its ids (--output <folder>); a .npy --output holds one vector per "
                         "text line")
    lines = [line.rstrip("\n") for line in text.utf8_lines(given)]
    if not any(line.strip() for line in lines):  # (as features: a vector per blank line is none)
        raise ValueError(f"--input={given}: empty, no line to embed (no text on any line); "
                         "expected one sentence per line; nothing written")
    paths.make_output_folder(output, "--output")  # (after the input's checks: a refusal makes none)
    vectors = sentence_models.embed(source, lines, batch_size=BATCH_SIZE.value or 32,
                                    spec=_sentence_spec(source))
    with paths.path(output).open("wb") as f:
        np.save(f, vectors)
    print(json.dumps({"lines": len(lines), "output": output, "dim": int(vectors.shape[1])}))


def cmd_mine(args: list[str]) -> None:
    """Writes the --input pair file again as JSON lines, each row with --negatives hard
    negatives mined by the checkpoint's sentence vectors (data.num_negatives trains on them)."""
    from bert_jax import paths
    from bert_jax.data import text
    from bert_jax.interop import sentence_models

    source, output = require(CHECKPOINT, "mine"), require(OUTPUT, "mine")
    if args:
        raise app.UsageError(f"mine takes no arguments (got {args}); use --input and --output")
    paths.check_new_file(output, "--output", "mine")
    corpus = ([line.rstrip("\n") for line in text.utf8_lines(CORPUS.value) if line.strip()]
              if CORPUS.value else None)
    if corpus == []:
        raise ValueError(f"--corpus={CORPUS.value}: no passage to mine from (the file is empty or "
                         "blank); give one passage per line, or leave --corpus out")
    paths.make_output_folder(output, "--output")
    rows = sentence_models.mine_negatives(source, require(INPUT, "mine"), NEGATIVES.value,
                                          corpus=corpus, batch_size=BATCH_SIZE.value or 32)
    with paths.open(output, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    print(json.dumps({"rows": len(rows), "output": output,
                      "negatives": min(len(r["negatives"]) for r in rows)}))


def _sentence_spec(source: str):
    """The checkpoint's SentenceSpec with --pooling's pooling, or None (its own) without it."""
    from bert_jax.interop import sentence_models

    if POOLING.value is None:
        return None
    return dataclasses.replace(sentence_models.read_spec(source), pooling=POOLING.value)


def cmd_eval_embeddings(args: list[str]) -> None:
    """Prints one JSON line: the checkpoint's sentence vectors scored on STS (Pearson and
    Spearman of cosine) and on retrieval (nDCG@10, MRR@10, recall, MAP@100, ...), each with a
    seeded 95% bootstrap interval, as sentence-transformers' evaluators compute them; --bm25
    adds BM25's rankings of the same retrieval sets (<set>_bm25), the lexical baseline."""
    import numpy as np

    from bert_jax.interop import sentence_models
    from bert_jax.tasks import retrieval, scoring
    from bert_jax.training import metrics

    source = CHECKPOINT.value
    if args or not (STS.value or BEIR.value or SQUAD.value):
        raise app.UsageError("eval-embeddings takes no arguments and needs --sts, --beir or --squad "
                             f"(got {args})")
    if source is None and not BM25.value:
        raise app.UsageError("eval-embeddings needs --checkpoint (or --bm25 alone: BM25's "
                             "retrieval scores)")
    if source is None and STS.value:
        raise app.UsageError("--sts needs --checkpoint: BM25 scores retrieval, not sentence pairs")
    if BM25.value:
        retrieval.import_bm25s()  # missing: said now, not after the dense vectors

    encoders: list = []  # the checkpoint loaded once, its programs compiled once for every side

    def vectors(texts: list[str]) -> np.ndarray:
        if not encoders:
            encoders.append(sentence_models.Encoder(source, _sentence_spec(source)))
        return encoders[0].encode(texts, BATCH_SIZE.value or 32)

    result: dict = {"checkpoint": source}
    if STS.value:
        s1, s2, gold = retrieval.read_sts(STS.value)
        both = vectors(s1 + s2)  # one load and compilation for the two sides
        result["sts"] = {"pairs": len(gold), **retrieval.evaluate_sts(
            both[:len(s1)], both[len(s1):], gold, n=BOOTSTRAP.value)}
        if note := scoring.constant_note(f"--sts={STS.value}", gold, retrieval.pair_cosines(
                both[:len(s1)], both[len(s1):])):  # (gold scores that are all equal: refused)
            logging.getLogger(__name__).warning(note)
    for name, data in (("beir", BEIR.value), ("squad", SQUAD.value)):
        if not data:
            continue
        corpus, queries, relevant = (retrieval.read_beir(data, SPLIT.value or "test")
                                     if name == "beir" else retrieval.squad_retrieval(data))
        asked = [q for q in queries if relevant.get(q)]
        ids = list(corpus)
        retrieval.check_corpus(f"--{name}={data}", len(ids))
        size = {"queries": len(asked), "corpus": len(ids)}
        wanted = [relevant[q] for q in asked]
        if source is not None:
            result[name] = {**size, **retrieval.evaluate_retrieval(
                vectors([queries[q] for q in asked]), vectors([corpus[c] for c in ids]), ids,
                wanted, n=BOOTSTRAP.value)}
        if BM25.value:
            result[f"{name}_bm25"] = {**size, **retrieval.evaluate_bm25(
                [queries[q] for q in asked], [corpus[c] for c in ids], ids, wanted,
                n=BOOTSTRAP.value)}
    print(metrics.json_dumps(result))
