"""Sentence-embedding models: an encoder of any BERT family plus pooling (the [CLS] vector, or
the mean or max of the tokens' last hidden states) and an optional L2 normalisation, as the
sentence-transformers library composes them, in and out of its folders.

A sentence-transformers folder lists its modules in `modules.json`: a Transformer (a Hugging
Face folder, at the folder's root or in `0_Transformer/`, with `sentence_bert_config.json`:
max_seq_length, do_lower_case), a Pooling (`1_Pooling/config.json`: which pooling) and
optionally a Normalize. `convert_st` turns one into our checkpoint folder (convert.convert_hf
of its Transformer) plus `sentence_model.json` (SentenceSpec); `embed` gives the sentence
vectors of a checkpoint; `export_st` writes a folder that
`sentence_transformers.SentenceTransformer(path).encode` loads (export.export_hf plus the
module files). Other modules (Dense, a second Transformer, ...) are refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.training import checkpoint
from bert_jax.training import state as state_lib

SPEC_FILE = "sentence_model.json"
POOLINGS = ("cls", "mean", "max")
_MODULES = "sentence_transformers.models."
# 1_Pooling/config.json's flags for each of our poolings (the others must be false).
_POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                  "max": "pooling_mode_max_tokens"}
_OTHER_FLAGS = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                "pooling_mode_lasttoken")


@dataclasses.dataclass(frozen=True)
class SentenceSpec:
    """How a checkpoint's encoder becomes a sentence vector."""

    pooling: str = "cls"  # cls | mean | max (over the sentence's tokens, [CLS] and [SEP] included)
    normalize: bool = False  # L2-normalised vectors (cosine = dot product)
    max_seq_length: int = 512  # tokens per sentence, [CLS] and [SEP] included; longer are cut
    do_lower_case: bool = False  # sentence_bert_config.json's, kept for export

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r}; choose one of {list(POOLINGS)}")
        if self.max_seq_length < 3:
            raise ValueError(f"max_seq_length={self.max_seq_length} must be >= 3")


# Each SentenceSpec field as JSON holds it (sentence_model.json, embed.json): (type, least value).
SPEC_KINDS = {"pooling": (str, None), "normalize": (bool, None), "max_seq_length": (int, 3),
              "do_lower_case": (bool, None)}


def read_folder(folder: str | os.PathLike) -> tuple[Any, SentenceSpec]:
    """(the Transformer module's Hugging Face folder, the spec) of a sentence-transformers
    folder; a module this code does not reproduce is a ValueError naming it."""
    root = paths.path(folder)
    modules = paths.read_json(root / "modules.json", "a sentence-transformers folder lists its "
                              "modules there", kind=list)
    if not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{root / 'modules.json'}: expected a list of modules")
    # Module types by class name: sentence-transformers 6 names them by their new modules
    # (sentence_transformers.base.modules.transformer.Transformer), earlier versions
    # sentence_transformers.models.Transformer.
    types = [str(m.get("type", "")) for m in modules]
    kinds = [t.rsplit(".", 1)[-1] if t.startswith("sentence_transformers.") else t for t in types]
    unknown = [(m, k) for m, k in zip(modules, kinds) if k not in ("Transformer", "Pooling", "Normalize")]
    # each at most once, in that order: pooled twice, or normalised before pooling, is
    # another model than the one bert_jax would convert
    ordered = [k for k in ("Transformer", "Pooling", "Normalize") if k in kinds]
    if unknown or kinds != ordered or kinds[:1] != ["Transformer"]:
        shown = (f"module {unknown[0][0].get('name')!r} of type {unknown[0][0].get('type')!r}"
                 if unknown else f"modules {kinds}")
        raise ValueError(f"{root / 'modules.json'}: {shown}: bert_jax reproduces a Transformer "
                         f"followed by Pooling and Normalize only (each once, in that order)")
    transformer = root / str(modules[0].get("path", ""))
    settings_file = transformer / "sentence_bert_config.json"
    what = "the Transformer module's settings (sentence-transformers writes them): fix or remove it"
    settings = paths.read_json(settings_file, what) if settings_file.is_file() else {}
    tokenizer_file = transformer / "tokenizer_config.json"
    tokenizer = (paths.read_json(tokenizer_file, "the tokenizer's settings")
                 if tokenizer_file.is_file() else {})
    # (sentence-transformers 6 keeps max_seq_length as the tokenizer's model_max_length; HF
    # writes a huge number there for "no limit")
    length = tokenizer.get("model_max_length")
    length = length if isinstance(length, int) and 3 <= length < 1 << 20 else 512
    if settings.get("max_seq_length") is not None:
        length = paths.json_field(settings, "max_seq_length", int, settings_file, what, at_least=3)
    lower = paths.json_field(settings, "do_lower_case", bool, settings_file, what, default=False)
    pooling, normalize = "cls", "Normalize" in kinds
    if "Pooling" in kinds:
        where = root / str(modules[kinds.index("Pooling")].get("path", "")) / "config.json"
        pooling = _pooling(where, transformer)
    return transformer, SentenceSpec(pooling, normalize, length, lower)


def _pooling(where, transformer) -> str:
    """The pooling a Pooling module's config.json names, one of POOLINGS; its
    word_embedding_dimension must be the Transformer's hidden size."""
    what = "the Pooling module's settings (sentence-transformers writes them): fix the file"
    flags = paths.read_json(where, what)
    if "pooling_mode" in flags:  # sentence-transformers 6: one name
        mode = paths.json_field(flags, "pooling_mode", str, where, what)
        chosen, other = ([mode], []) if mode in POOLINGS else ([], [mode])
    else:
        chosen = [p for p, flag in _POOLING_FLAGS.items()
                  if paths.json_field(flags, flag, bool, where, what, default=False)]
        other = [flag for flag in _OTHER_FLAGS
                 if paths.json_field(flags, flag, bool, where, what, default=False)]
    if other or len(chosen) != 1:
        raise ValueError(f"{where}: pooling {other or chosen or 'none'}: bert_jax pools by one "
                         f"of {list(POOLINGS)} (the [CLS] vector, the mean or the max)")
    dim = paths.json_field(flags, "word_embedding_dimension", int, where, what, default=None)
    hf_config = transformer / "config.json"
    hidden = (paths.read_json(hf_config, "the Transformer's Hugging Face config").get("hidden_size")
              if hf_config.is_file() else None)
    if dim is not None and isinstance(hidden, int) and dim != hidden:
        raise ValueError(f"{where}: word_embedding_dimension={dim}, but the Transformer's "
                         f"{hf_config} has hidden_size={hidden}: the pooled vector is the hidden "
                         "state; the folder's modules are of different models")
    return chosen[0]


def read_spec(checkpoint_dir: str | os.PathLike) -> SentenceSpec:
    """The checkpoint's sentence_model.json, or the defaults (the [CLS] vector) without one."""
    file = paths.path(checkpoint_dir) / SPEC_FILE
    if not file.is_file():
        config = checkpoint.read_config(checkpoint_dir)
        model = config["model"]
        if "embedding_pooling" not in model:  # not a sentence model: the [CLS] vector
            return SentenceSpec()
        # a trained sentence model (training/contrastive.py) says how it pools in its config
        length = int(config["data"]["max_seq_length"])
        return SentenceSpec(model["embedding_pooling"], bool(model["normalize_embeddings"]), length)
    what = "written by `bert-jax convert st:`: fix it, or remove it to pool the [CLS] vector"
    given = paths.read_json(file, what)
    names = {f.name for f in dataclasses.fields(SentenceSpec)}
    if set(given) - names:
        raise ValueError(f"{file}: keys {sorted(set(given) - names)}; expected only {sorted(names)}")
    typed = {k: paths.json_field(given, k, kind, file, what, at_least=least)
             for k, (kind, least) in SPEC_KINDS.items() if k in given}
    if typed.get("pooling", "cls") not in POOLINGS:
        raise ValueError(f"{file}: key 'pooling' is {typed['pooling']!r}; choose one of "
                         f"{list(POOLINGS)}")
    return SentenceSpec(**typed)


def convert_st(source: str | os.PathLike, out: str | os.PathLike) -> dict[str, Any]:
    """A sentence-transformers folder -> our checkpoint folder `out` with its SentenceSpec."""
    from bert_jax.interop import convert

    transformer, spec = read_folder(source)
    settings_file = transformer / "sentence_bert_config.json"

    def check_length(model_cfg: dict[str, Any]) -> None:
        """spec.max_seq_length within the model's position table: sentence_bert_config.json's
        past it is refused (sentence-transformers would index past the table); the tokenizer's
        model_max_length past it is cut there, as sentence-transformers takes the smaller."""
        nonlocal spec
        positions = models.split_model_config(model_cfg)[1].max_positions
        if positions is None or spec.max_seq_length <= positions:
            return
        if settings_file.is_file() and paths.read_json(settings_file, "").get("max_seq_length") is not None:
            raise ValueError(f"{settings_file}: max_seq_length={spec.max_seq_length}, but the model "
                             f"has {positions} positions (its config.json's "
                             f"max_position_embeddings): a longer sentence has no position "
                             f"vector; set max_seq_length to {positions} or less")
        spec = dataclasses.replace(spec, max_seq_length=positions)

    report = convert.convert_hf(transformer, out, "bert", check_model=check_length)
    (paths.path(out) / SPEC_FILE).write_text(json.dumps(dataclasses.asdict(spec), indent=1) + "\n")
    return {**report, "sentence": dataclasses.asdict(spec)}


pool = models.sentence_pool


# Rows are padded to a multiple of this many tokens: sentences sorted by length share a few
# row lengths (one compile each) instead of all taking the longest one's.
BUCKET = 16


def vector_fn(encoder: nnx.Module, spec: SentenceSpec):
    """(vectors, state): `vectors(state, input_ids, token_type_ids, attention_mask)` is the
    jitted [B, D] sentence vectors of `encoder` (its state split off) pooled as `spec` says."""
    graphdef, state = nnx.split(encoder)

    @jax.jit
    def vectors(state, input_ids, token_type_ids, attention_mask):
        out = nnx.merge(graphdef, state)(input_ids, token_type_ids, attention_mask,
                                         return_hidden=True)
        return pool(out["hidden_states"][-1], attention_mask, spec.pooling, spec.normalize)

    return vectors, state


class Encoder:
    """A checkpoint's encoder and SentenceSpec (`spec` instead, if given), loaded once:
    `encode(sentences)` gives their [N, D] float32 vectors. Each batch is split over `devices`
    (default: this host's), the weights replicated on each. `step`: that checkpoint (default:
    the latest)."""

    def __init__(self, checkpoint_dir: str | os.PathLike, spec: SentenceSpec | None = None,
                 devices: Sequence[jax.Device] | None = None, step: int | None = None):
        self.spec = spec = spec or read_spec(checkpoint_dir)
        model_cfg = checkpoint.read_config(checkpoint_dir, step)["model"]
        name, fields = models.split_model_config(model_cfg)
        if models.CONFIGS[name] is not models.BertConfig:
            raise ValueError(f"{checkpoint_dir}: holds a {name!r} model ({fields.family} family); "
                             "sentence vectors need a BERT-family encoder checkpoint")
        self.tokenizer = tokenizer_lib.load_tokenizer(checkpoint_dir)
        self.tokenizer.check_fits(fields.vocab_size, f"the model in {checkpoint_dir}")
        _, model = state_lib.load_model(checkpoint_dir, step, model_cfg=model_cfg)
        encoder = functools.reduce(getattr, models.encoder_path(name), model)
        self.vectors, state = vector_fn(encoder, spec)
        mesh = Mesh(np.array(devices or jax.local_devices()), ("batch",))
        self.rows = NamedSharding(mesh, PartitionSpec("batch"))
        self.state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
        self.dim = fields.emb_dim
        self.limit = min(spec.max_seq_length, fields.max_positions or spec.max_seq_length)

    def encode(self, sentences: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """[N, D] vectors, in the order given. Batches of sentences of similar length (sorted),
        each padded to a multiple of BUCKET tokens (at most spec.max_seq_length, [CLS] and
        [SEP] included; longer sentences are cut), so padding costs little and a few row
        lengths compile."""
        ids = self.tokenizer.encode_batch(list(sentences))
        lengths = np.array([min(len(x) + 2, self.limit) for x in ids], np.int64)
        devices = self.rows.mesh.size
        batch_size = -(-batch_size // devices) * devices  # whole rows on every device
        order = np.argsort(-lengths, kind="stable")  # the longest first: its compile first
        out = np.zeros((len(ids), self.dim), np.float32)
        pending = []  # dispatched, not yet read: the next batch is made while one computes
        for start in range(0, len(ids), batch_size):
            rows = order[start:start + batch_size]
            length = min(self.limit, -(-int(lengths[rows].max()) // BUCKET) * BUCKET)
            batch = self.tokenizer.pair_rows([ids[i] for i in rows], [None] * len(rows), length)
            batch = {k: np.pad(v, [(0, batch_size - len(rows)), (0, 0)]) for k, v in batch.items()}
            pending.append((rows, self.vectors(self.state, *(
                jax.device_put(batch[k], self.rows)
                for k in ("input_ids", "token_type_ids", "attention_mask")))))
            if len(pending) > 2:
                done, got = pending.pop(0)
                out[done] = np.asarray(got)[:len(done)]
        for done, got in pending:
            out[done] = np.asarray(got)[:len(done)]
        return out


def embed(checkpoint_dir: str | os.PathLike, sentences: Sequence[str], *, batch_size: int = 32,
          spec: SentenceSpec | None = None) -> np.ndarray:
    """[N, D] float32 vectors of `sentences` by the checkpoint's encoder and its SentenceSpec
    (`spec` instead, if given): Encoder(checkpoint_dir, spec).encode(sentences)."""
    return Encoder(checkpoint_dir, spec).encode(sentences, batch_size)


def export_st(source: str | os.PathLike, out: str | os.PathLike, step: int | None = None
              ) -> dict[str, Any]:
    """Checkpoint `source` (with its SentenceSpec) as a sentence-transformers folder `out`: the
    Hugging Face folder at its root (export.export_hf) and the Pooling and Normalize modules."""
    from bert_jax.interop import export

    spec = read_spec(source)
    model_cfg = checkpoint.read_config(source, step)["model"]
    report = export.export_hf(source, out, step)
    root = paths.path(out)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _MODULES + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _MODULES + "Pooling"}]
    if spec.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _MODULES + "Normalize"})
        (root / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (root / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (root / "1_Pooling").mkdir(parents=True, exist_ok=True)
    flags = {"word_embedding_dimension": int(model_cfg["emb_dim"]),
             **{flag: pooling == spec.pooling for pooling, flag in _POOLING_FLAGS.items()},
             **{flag: False for flag in _OTHER_FLAGS}, "include_prompt": True}
    (root / "1_Pooling" / "config.json").write_text(json.dumps(flags, indent=2) + "\n")
    # At most the model's positions (sentence-transformers cuts texts there, and a longer one
    # would index past the position table), as Encoder cuts them.
    positions = models.split_model_config(model_cfg)[1].max_positions
    settings = {"max_seq_length": min(spec.max_seq_length, positions or spec.max_seq_length),
                "do_lower_case": spec.do_lower_case}
    (root / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return {**report, "sentence": {**dataclasses.asdict(spec), **settings}}


def mine_negatives(checkpoint_dir: str | os.PathLike, pairs_file: str | os.PathLike,
                   k: int, *, corpus: Sequence[str] | None = None, batch_size: int = 32
                   ) -> list[dict[str, Any]]:
    """Hard negatives by the checkpoint's sentence vectors (sentence-transformers'
    mine_hard_negatives without its margins): for each row of a pair file (queries with
    positives), the k documents of `corpus` (default: every distinct positive and negative of
    the file) closest to its query by cosine that are none of that query's positives nor the
    query itself; a query left with fewer than k is a ValueError (sentence-transformers drops
    such rows; data.num_negatives=k training would refuse them). Rows
    come back as {"query", "positive", "negatives"} in the file's order."""
    from bert_jax.tasks import pairs, retrieval

    if pairs.beir_source(pairs_file) is not None:  # (training reads it: mining does not)
        raise ValueError(f"{pairs_file}: a BEIR folder or qrels file; mining reads a pair file (JSON "
                         "lines or TSV with query and positive columns): write its queries with "
                         "their relevant documents as one, then mine that")
    rows = pairs.read_pairs(pairs_file, skip_bad_rows=None)  # no config: no key skips rows
    if not rows:
        raise ValueError(f"{pairs_file}: no pairs to mine for")
    if rows[0].score is not None:
        raise ValueError(f"{pairs_file}: scored pairs; mining needs queries with their positives")
    if k < 1:
        raise ValueError(f"k={k}: mine at least one negative per query")
    texts = list(dict.fromkeys(corpus if corpus is not None else
                               [t for r in rows for t in (r.positive, *r.negatives)]))
    positives: dict[str, set[str]] = {}
    for r in rows:
        positives.setdefault(r.query, set()).add(r.positive)
    encoder = Encoder(checkpoint_dir)
    queries = list(positives)
    q, c = encoder.encode(queries, batch_size), encoder.encode(texts, batch_size)
    # k, plus room for the query's positives and its own text, which may be in the corpus
    width = min(len(texts), k + 1 + max(len(p) for p in positives.values()))
    top = retrieval.rank(q, c, [f"{i:09d}" for i in range(len(texts))], width)
    mined = {query: [texts[i] for i in row if texts[i] not in positives[query] and texts[i] != query][:k]
             for query, row in zip(queries, top)}
    if short := [q for q in queries if len(mined[q]) < k]:  # training on k would refuse those rows
        fewest = min(len(mined[q]) for q in short)
        raise ValueError(
            f"{pairs_file}: {len(short)} of {len(queries)} queries have fewer than {k} negatives "
            f"to mine (e.g. {short[0]!r}: {len(mined[short[0]])}; the corpus holds {len(texts)} "
            "distinct texts, less their positives and themselves); "
            + (f"ask for --negatives={fewest}, or " if fewest else "")
            + "give a --corpus with more passages; nothing written")
    return [{"query": r.query, "positive": r.positive, "negatives": mined[r.query]} for r in rows]

