"""Translating text with a trained encoder-decoder: `Translator` (batched beam or greedy
decoding on the mesh, detokenized output), BLEU on the dev set during training
(`TranslationEvaluator`), and `bert-jax translate` (`translate_file`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import config as config_lib
from bert_jax import paths, specs
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data import translation
from bert_jax.specs import DecodeSpec, RunSpec, TranslationData
from bert_jax.training import checkpoint, evaluate, objectives, sharding, state
from bert_jax.translation import bleu, decode

log = logging.getLogger(__name__)


def _bucket(n: int) -> int:
    """Source rows padded to a power of two (>= 8), so a file compiles a few shapes, not one per length."""
    return max(8, 1 << math.ceil(math.log2(max(n, 1))))


class Translator:
    """Sentences -> translations with `params`: sources encoded (+EOS), sorted by length,
    decoded in batches of `batch_size` sentences, detokenized, returned in input order."""

    def __init__(self, config: RunSpec, graphdef, mesh, tokenizer, *, beam_size: int, alpha: float,
                 max_extra: int, batch_size: int):
        self.shards = mesh.shape["data"] * mesh.shape["fsdp"]
        self.batch_size = self._rows(batch_size)
        self.mesh, self.tokenizer = mesh, tokenizer
        # [CLS] and [MASK] are never targets; pad and EOS are handled by the search itself.
        banned = tuple(sorted({tokenizer.cls_id, tokenizer.mask_id} - {tokenizer.sep_id}))
        self.fn = decode.make_translate_fn(graphdef, mesh, config, eos_id=tokenizer.sep_id,
                                           beam_size=beam_size, alpha=alpha, max_extra=max_extra,
                                           banned_ids=banned)

    def _rows(self, n: int) -> int:
        return -(-n // self.shards) * self.shards  # a multiple of the batch shards

    def __call__(self, params, sentences: list[str], *, progress_every: float = 0.0) -> list[str]:
        """A translation per sentence, in order; an empty (or blank) sentence's is empty, not
        decoded (the model would make up a sentence from nothing)."""
        kept = [i for i, s in enumerate(sentences) if s.strip()]
        out = [""] * len(sentences)
        if kept:
            hyps = self._translate(params, [sentences[i] for i in kept], progress_every=progress_every)
            for i, hyp in zip(kept, hyps):
                out[i] = hyp
        return out

    def _translate(self, params, sentences: list[str], *, progress_every: float) -> list[str]:
        tok = self.tokenizer
        ids = [np.append(x, tok.sep_id).astype(np.int32) for x in tok.encode_batch(sentences)]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        out: list[str | None] = [None] * len(ids)
        # Fewer sentences than a batch (a dev BLEU set) decode as a smaller batch rather than
        # beside padding rows that cost as much as sentences; a longer input keeps one row
        # count, so that its last, partial batch reuses a compiled shape.
        batch_size = min(self.batch_size, self._rows(max(len(ids), 1)))
        t0 = last = time.perf_counter()
        for start in range(0, len(ids), batch_size):
            rows = order[start:start + batch_size]
            src = np.zeros((batch_size, _bucket(len(ids[rows[0]]))), np.int32)
            for r, i in enumerate(rows):
                src[r, :len(ids[i])] = ids[i]
            for r, hyp in zip(rows, self._decode(params, src)):
                stop = np.flatnonzero(hyp == tok.sep_id)
                out[r] = tok.decode(hyp[:stop[0]] if len(stop) else hyp)
            done = start + len(rows)
            if progress_every and (time.perf_counter() - last > progress_every or done == len(ids)):
                last = time.perf_counter()
                log.info(f"translated {done}/{len(ids)} sentences "
                         f"({done / max(last - t0, 1e-9):.1f}/s)")
        return out

    def _decode(self, params, src: np.ndarray) -> np.ndarray:
        """Every host holds the whole batch: each device takes its rows, all get all outputs."""
        rows = jax.make_array_from_callback(src.shape, sharding.batch_sharding(self.mesh, 2),
                                            lambda index: src[index])
        out = self.fn(params, rows)
        return np.asarray(multihost_utils.process_allgather(out, tiled=True)
                          if jax.process_count() > 1 else out)


def translator(spec: RunSpec, graphdef, mesh, tokenizer, **changes) -> Translator:
    """A Translator with the run's `decode` section (the defaults where a run has none);
    `changes` that are not None take precedence."""
    d = dataclasses.asdict(spec.decode or DecodeSpec())
    d.update({k: v for k, v in changes.items() if v is not None})
    return Translator(spec, graphdef, mesh, tokenizer, **d)


class TranslationEvaluator:
    """The objective's loss and token accuracy on the dev pairs (`losses`, an
    evaluate.ObjectiveEvaluator), plus sacreBLEU of the decoded first data.bleu_sentences
    dev sources (0 = all, -1 = none)."""

    def __init__(self, *, config: RunSpec, graphdef, objective, mesh, task=None):
        self.losses = evaluate.ObjectiveEvaluator(config=config, graphdef=graphdef,
                                                  objective=objective, mesh=mesh)
        self.config, self.graphdef, self.mesh = config, graphdef, mesh
        self.bleu_set = None  # (translator, sources, references), read on first use

    def prepare(self) -> None:
        """Reads a loss batch and the BLEU sentences now, so bad dev files stop a run early."""
        self.losses.prepare()
        self._bleu_set()

    def _bleu_set(self):
        data = specs.data(self.config.data).keys
        n = data.bleu_sentences
        if self.bleu_set is None and n >= 0:
            pairs = translation.open_pairs(data, "validation")
            chosen = range(len(pairs) if n == 0 else min(n, len(pairs)))
            sources, references = zip(*(pairs[i] for i in chosen))
            tokenizer = tokenizer_lib.load_tokenizer(tokenizer_lib.required_dir(self.config.data.tokenizer))
            self.bleu_set = (translator(self.config, self.graphdef, self.mesh, tokenizer),
                             list(sources), list(references))
        return self.bleu_set

    def run(self, params, *, config: RunSpec | None = None, out_dir=None,
            splits=None) -> dict[str, float]:
        results = self.losses.run(params, config=config)
        if self._bleu_set() is not None:
            translate, sources, references = self.bleu_set
            t0 = time.perf_counter()
            score = bleu.corpus_bleu(translate(params, sources), references)
            results["eval/bleu"] = score["bleu"]
            log.info(f"dev BLEU {score['bleu']:.2f} on {len(sources)} sentences "
                     f"({time.perf_counter() - t0:.0f}s; {score['signature']})")
        return results


def _run_spec(checkpoint_dir: str) -> RunSpec:
    """The stored run config of a checkpoint directory (a workdir or an average/convert output),
    as translating reads it (_translate_spec), on this machine's devices."""
    stored = checkpoint.read_config(checkpoint_dir)
    # (by name: a bare encoder has no objective to build, and is no encoder-decoder either)
    if stored["model"].get("name") not in objectives.Translation.models:
        raise ValueError(f"--checkpoint={checkpoint_dir} holds a model.name="
                         f"{stored['model'].get('name')!r} model; translate needs an encoder-decoder")
    config = config_lib.complete(ml_collections.ConfigDict(stored))
    config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})  # this machine's devices
    return _translate_spec(config)


def _translate_spec(config: ml_collections.ConfigDict) -> RunSpec:
    """What translating reads of a stored run config, resolved: the model, mesh, sharding and
    decode sections and the tokenizer as stored; its data source (maybe one registered by the
    training job's own module, data/sources.py; none in a hand-made folder's config) is not
    read, so the spec gets a translation data section."""
    tokenizer = config.data.get("tokenizer", "") if "data" in config else ""
    config = config.copy_and_resolve_references()
    config.data = specs.section(TranslationData)
    config.data.tokenizer = tokenizer
    return config_lib.resolve(config, training=False)


def check_flags(beam_size: int | None, alpha: float | None, batch_size: int | None) -> None:
    """The decoding flags a user gave (None: the run config's), checked before anything loads."""
    if beam_size is not None and beam_size < 1:
        raise ValueError(f"--beam={beam_size}: the beam size must be >= 1 (1 = greedy)")
    if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"--alpha={alpha}: the length penalty exponent (((5 + length) / 6) ** alpha) "
                         "must be a finite number >= 0 (0 = no length penalty; the paper's 0.6)")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"--batch_size={batch_size}: sentences per batch must be >= 1")


def check_output(output_path: str) -> None:
    """`output_path` is a new file that can be written: never an existing file (translations
    that took an hour), a directory, or a place whose folder cannot be made; checked before
    decoding, which would otherwise find it only at the end."""
    out = paths.path(output_path)
    if out.is_dir():
        raise ValueError(f"--output={output_path} is a directory; give the path of a new file for "
                         "the translations (one line per input line)")
    if out.exists():
        raise FileExistsError(f"{output_path} exists; translate never replaces a file: choose another "
                              "--output, or delete that one first")
    if paths.is_remote(output_path):
        return  # a bucket has no folders to make; the upload at the end creates the object
    paths.make_output_folder(output_path, "--output")
    if not os.access(out.parent, os.W_OK):
        raise PermissionError(f"--output={output_path}: its folder {out.parent} is not writable; choose "
                              "another --output")


def _read_input(input_path: str) -> list[str]:
    """The source sentences; an input without any text is an error, not an empty output."""
    if not paths.workdir_path(input_path).is_file():
        raise FileNotFoundError(f"--input={input_path}: no such file; give a text file with one source "
                                "sentence per line (plain or .gz)")
    sources = bleu.read_lines(input_path)
    if not any(s.strip() for s in sources):
        raise ValueError(f"--input={input_path}: empty (no text on any line); give a file with one "
                         "source sentence per line")
    if empty := [n for n, s in enumerate(sources, 1) if not s.strip()]:
        log.warning(f"warning: --input={input_path}: {len(empty)} of its {len(sources)} lines are "
                    f"empty (the first: line {empty[0]}); each gets an empty output line, so the "
                    "lines still match the input's (and a reference's)")
    return sources


def _write_output(output_path: str, text: str) -> None:
    """The translations, whole: a local file appears complete (renamed from .partial) or not at all."""
    if paths.is_remote(output_path):  # an object appears whole when its upload completes
        paths.path(output_path).write_text(text, "utf-8")
        return
    out = Path(output_path)
    tmp = out.with_name(out.name + ".partial")
    try:
        tmp.write_text(text, "utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def translate_file(checkpoint_dir: str, input_path: str, output_path: str, *,
                   beam_size: int | None = None, alpha: float | None = None,
                   batch_size: int | None = None, reference: str | None = None) -> dict:
    """Translates each line of `input_path` into the new file `output_path` (written whole at
    the end, so a failure leaves no partial file); with `reference`, scores the output with
    sacreBLEU. Every path may be local or gs://. Flags, output and input are checked before the
    model loads."""
    check_flags(beam_size, alpha, batch_size)
    spec = _run_spec(checkpoint_dir)  # its stored config: a few kB, no weights
    check_output(output_path)
    sources = _read_input(input_path)
    refs = bleu.read_lines(reference) if reference else None
    if refs is not None and len(refs) != len(sources):
        raise ValueError(f"--reference={reference} has {len(refs)} lines but --input={input_path} "
                         f"has {len(sources)}; give the reference of the same sentences")
    tokenizer = tokenizer_lib.checkpoint_tokenizer(checkpoint_dir, spec.data.tokenizer)
    mesh = sharding.make_mesh(spec.mesh)
    graphdef, params = state.restore_params(spec, checkpoint_dir, mesh)
    t0 = time.perf_counter()
    hyps = translator(spec, graphdef, mesh, tokenizer, beam_size=beam_size, alpha=alpha,
                      batch_size=batch_size)(params, sources, progress_every=10.0)
    seconds = time.perf_counter() - t0
    if jax.process_index() == 0:
        _write_output(output_path, "".join(h + "\n" for h in hyps))
    report = {"output": output_path, "sentences": len(hyps), "seconds": round(seconds, 1)}
    if refs is not None:
        report["sacrebleu"] = bleu.corpus_bleu(hyps, refs)
        report["tokenized_bleu"] = bleu.tokenized_bleu(hyps, refs)
    return report
