"""`config.data` -> an iterator of host-local numpy batches with get_state()/set_state().

Pretraining pipeline (grain): this host's documents (every process_count-th, so hosts are
disjoint and together complete) -> shuffled each epoch -> each document turned into
instances by the create_pretraining_data algorithm with an rng fixed by (seed, document,
epoch) -> window shuffle -> (data.pack: instances packed first-fit into rows) -> batches.
MLM-only data (data.instances, data/pretraining.py): "packed" turns each document into masked
sequences of at most data.max_seq_length, packed first fit into rows; "full_rows" concatenates
the documents and cuts full rows (grain's concat-then-split), masked per row, window shuffled.
Training batches mask data.masked_lm_prob of the tokens, evaluation batches
data.eval_masked_lm_prob (0: the same).
Every stage is checkpointable, so the iterator state saved with a checkpoint resumes the
exact stream.

Translation pipeline: this host's sentence pairs -> shuffled each epoch -> encoded, too long
ones dropped -> packed into rows (data/translation.py) -> batches; resumable the same way.

Batches come in the layouts of data/packing.py; fields under their old names (input_mask,
segment_ids as token types, <x>_segmentation) are renamed on the way (packing.rename_old).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import grain
import jax
import numpy as np
from grain.experimental import (
    ConcatThenSplitIterDataset,
    FlatMapIterDataset,
    FlatMapTransform,
    WindowShuffleIterDataset,
)

from bert_jax import config as config_lib
from bert_jax import specs
from bert_jax.data import packing, pretraining, sources, translation
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.finetune import FeaturePipeline, pad_batch
from bert_jax.specs import RunSpec
from bert_jax.training import objectives, sharding

log = logging.getLogger(__name__)

@dataclasses.dataclass
class _Instances(FlatMapTransform):
    """(epoch, k) -> feature dicts of the k-th document of the split."""

    docs: object  # random access: docs[doc_ids[k]]
    doc_ids: np.ndarray
    tokenizer: object
    data: specs.PretrainingData
    seed: int
    max_fan_out: int = 100_000

    def __post_init__(self):
        # Whole-word masking: whether each vocabulary id starts a word.
        self.starts_word = (self.tokenizer.word_starts(np.arange(self.tokenizer.vocab_size))
                            if self.data.whole_word_masking else None)

    def mask_options(self) -> dict:
        """mask_tokens' arguments (data/pretraining.py) of this run's tokenizer and data."""
        tok, d = self.tokenizer, self.data
        # As the original: [UNK] may be predicted; [CLS], [SEP], [MASK], padding never.
        return {"vocab_size": tok.vocab_size, "mask_id": tok.mask_id,
                "special_ids": {tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id},
                "masked_lm_prob": d.masked_lm_prob, "starts_word": self.starts_word}

    def flat_map(self, element):
        epoch, k = element
        d, tok, doc_id = self.data, self.tokenizer, int(self.doc_ids[k])
        # Static masking: dupe_factor fixed maskings, cycled; dynamic (0): new ones each epoch.
        epoch = epoch % d.dupe_factor if d.dupe_factor else epoch
        kind = d.instances
        if kind == "full_rows":  # masked per row, after the concatenation (full_row_features)
            return [pretraining.document_stream(self.docs[doc_id], doc_id, epoch, tok.sep_id)]
        rng = pretraining.document_rng(self.seed, doc_id, epoch)
        common = dict(cls_id=tok.cls_id, sep_id=tok.sep_id, max_seq_length=d.max_seq_length,
                      max_predictions_per_seq=d.max_predictions_per_seq, rng=rng)
        if kind == "packed":
            pieces = pretraining.document_pieces(self.docs[doc_id], d.max_seq_length - 2)
            return [pretraining.sequence_features(p, **common, **self.mask_options()) for p in pieces]
        instances = pretraining.create_instances(
            self.docs[doc_id], int(k), num_docs=len(self.doc_ids),
            get_doc=lambda j: self.docs[int(self.doc_ids[j])],
            max_seq_length=d.max_seq_length, short_seq_prob=d.short_seq_prob, rng=rng)
        # Packed rows take each instance unpadded; else one instance per padded row.
        make = pretraining.instance_features if d.pack else pretraining.to_features
        return [make(inst, **common, **self.mask_options()) for inst in instances]


class GrainBatches:
    """Host-local batches of a grain IterDataset of examples. Training streams repeat
    forever; evaluation streams make one pass and pad the last batch (example_weight 0), and
    with `num_batches` stop there (hosts that run out first give all-padding batches)."""

    def __init__(self, ds, *, batch_size: int, train: bool, num_batches: int | None = None,
                 worker_count: int = 0):
        ds = ds.batch(batch_size, drop_remainder=train)
        if worker_count > 0:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
        self.batch_size, self.train, self.num_batches = batch_size, train, num_batches
        self.iterator = iter(ds)
        self.produced, self._template = 0, None

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_batches is not None and self.produced >= self.num_batches:
            raise StopIteration
        try:
            batch = next(self.iterator)
        except StopIteration:
            if self.train or self.num_batches is None or self._template is None:
                raise
            # This host ran out first: all-padding batches keep the hosts in step.
            batch = {k: v[:0] for k, v in self._template.items()}
        self.produced += 1
        batch = packing.rename_old(batch)  # a dataset may hold its fields under their old names
        if self.train:
            return batch
        self._template = batch
        return pad_batch(batch, self.batch_size)

    def get_state(self) -> dict:
        return {"grain": self.iterator.get_state(), "produced": self.produced}

    def set_state(self, state: dict) -> None:
        self.iterator.set_state(_slices_as_tuples(state["grain"]))
        self.produced = int(state["produced"])


def _slices_as_tuples(state):
    """The grain state with concat-then-split's remainder slices as tuples again: the JSON the
    checkpoint stores makes them lists, and grain (0.2.18) compares a slice with the tuple
    (-1, -1) ("none"), so a list would cut rows from the wrong place after a resume."""
    if isinstance(state, dict):
        return {k: ({f: tuple(v) for f, v in s.items()} if k == "remainder_slices"
                    else _slices_as_tuples(s)) for k, s in state.items()}
    return state


def _check_hosts(n_local: int, n_all: int, train: bool, process_index: int, process_count: int,
                 num_batches: int | None, what: str) -> None:
    if n_local == 0:
        raise ValueError(f"process {process_index} of {process_count} got no {what} "
                         f"({n_all} in the split)")
    if not train and process_count > 1 and num_batches is None:
        raise ValueError("multi-host evaluation needs a fixed number of batches on every "
                         "host: set train.eval_steps > 0")


class PretrainingPipeline(GrainBatches):
    """Batches of BERT pretraining features for this host (see GrainBatches); `data` the
    run's data section (specs.PretrainingData, or a mapping of its keys)."""

    def __init__(self, docs, doc_ids: np.ndarray, tokenizer, data, *, seed: int,
                 batch_size: int, train: bool, process_index: int = 0, process_count: int = 1,
                 num_batches: int | None = None):
        data = specs.read(specs.PretrainingData, data, "data")
        local = np.arange(process_index, len(doc_ids), process_count)  # positions in doc_ids
        _check_hosts(len(local), len(doc_ids), train, process_index, process_count, num_batches,
                     "documents")
        n = len(local)
        positions = grain.MapDataset.source(local)
        if train:
            positions = positions.shuffle(seed).repeat(None)
        ds = positions.map_with_index(lambda i, k: (i // n, int(k))).to_iter_dataset()
        instances = _Instances(docs, np.asarray(doc_ids), tokenizer, data, seed)
        ds = FlatMapIterDataset(ds, instances)
        kind = data.instances
        if kind == "full_rows":  # the documents' streams cut into full rows, then masked
            rows = {k: data.max_seq_length - 1 for k in pretraining.STREAM_KEYS}  # + [CLS]
            ds = ConcatThenSplitIterDataset(ds, length_struct=rows).map(functools.partial(
                pretraining.full_row_features, seed=seed, cls_id=tokenizer.cls_id,
                max_seq_length=data.max_seq_length,
                max_predictions_per_seq=data.max_predictions_per_seq, **instances.mask_options()))
        if train and data.shuffle_window > 1:
            ds = WindowShuffleIterDataset(ds, window_size=data.shuffle_window, seed=seed)
        if data.packed:  # several sequences a row, first fit over a batch of rows
            lengths = pretraining.pack_lengths(
                data.max_seq_length, data.max_predictions_per_seq,
                data.max_instances_per_row if kind == "pairs" else None)
            ds = packing.first_fit(ds, lengths, rows=batch_size, seed=seed,
                                   train=train).map(pretraining.pack_row)
        super().__init__(ds, batch_size=batch_size, train=train, num_batches=num_batches,
                         worker_count=data.worker_count)


def translation_pipeline(config: RunSpec, split: str, *, batch_size: int, num_batches: int | None
                         ) -> GrainBatches:
    """Packed translation batches of this host's share of `split`'s pairs."""
    d = specs.data(config.data).keys
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_lib.required_dir(d.tokenizer))
    tokenizer.check_fits(config.model.vocab_size, f"data.tokenizer={d.tokenizer}")
    pairs = translation.open_pairs(d, split)
    if split == "train":
        dropped = translation.dropped_by_length(pairs, tokenizer, d.max_seq_length)
        log.info(f"translation data: {len(pairs):,} training pairs; data.max_seq_length="
                 f"{d.max_seq_length} drops {dropped:.1%} of them (estimated on the first 2,000)")
    index, count, train = jax.process_index(), jax.process_count(), split == "train"
    _check_hosts(len(range(index, len(pairs), count)), len(pairs), train, index, count,
                 num_batches, "sentence pairs")
    local = batch_size // count
    ds = translation.packed_dataset(pairs, tokenizer, max_len=d.max_seq_length, rows=local,
                                    seed=config.seed, train=train, process_index=index,
                                    process_count=count, bins=d.packing_bins)
    return GrainBatches(ds, batch_size=local, train=train, num_batches=num_batches,
                        worker_count=d.worker_count)


def _split_doc_ids(num_docs: int, split: str, heldout_every: int, has_own_split: bool
                   ) -> np.ndarray:
    """Documents of `split`; without a separate eval source every `heldout_every`-th
    document is held out for evaluation."""
    ids = np.arange(num_docs)
    if has_own_split or heldout_every <= 0:
        return ids
    held = ids % heldout_every == heldout_every - 1
    return ids[held] if split == "validation" else ids[~held]


def check_source(config: RunSpec) -> None:
    """The data config.data trains on can be read (its source's check: a TFDS dataset is
    prepared), found before the model is built, not after. Tasks check their files themselves."""
    spec = specs.data(config.data)
    if not spec.finetuning:
        source = sources.get(spec.source)
        if source.kind != "batches":  # (check_named's own, naming init_from's tokenizer too)
            tokenizer_lib.required_dir(spec.keys.tokenizer, init_from=config.init_from)
        source.check_named(spec.keys)  # (launch checks this too, where the data is not)
        source.check(spec.keys)


def open_documents(config: RunSpec, split: str, tokenizer):
    """(random-access documents, ids of the split's documents) for config.data."""
    d = specs.data(config.data).keys
    docs, own = sources.get(d.name).documents(d, split, tokenizer)
    ids = _split_doc_ids(len(docs), split, d.heldout_every, own)
    pairs = d.instances == "pairs"  # NSP draws random next segments elsewhere
    if len(ids) < (2 if pairs else 1):
        fix = ("set data.eval_files, or lower data.heldout_every (1 document in N is held out)"
               if not own and d.heldout_every > 0 else "give more documents")
        need = "NSP needs >= 2" if pairs else "it needs >= 1"
        raise ValueError(f"data: the {split} split has {len(ids)} documents of {len(docs)}; {need}: "
                         f"{fix}")
    return docs, ids


def pack_options(config: RunSpec, train: bool) -> dict | None:
    """packing.pack_batch's arguments for a fine-tuning run's batches, or None (not packed): rows a
    multiple of the mesh's batch shards, one packing per microbatch when training."""
    if not specs.data(config.data).keys.pack:
        return None
    how = objectives.for_config(config).packing
    if how not in ("cls", "tokens"):
        raise config_lib.ConfigError(
            f"data.pack=True: model.name={config.model_name!r} batches cannot be packed (its "
            "head reads whole rows); set --config.data.pack=false")
    sizes = config_lib.mesh_shape(config.mesh, jax.device_count())
    _check_host_blocks(config, sizes["data"] * sizes["fsdp"])
    return {"row_multiple": sizes["data"] * sizes["fsdp"],
            "microbatches": config.train.grad_accum_steps if train else 1,
            "token_index": how == "tokens"}


def _check_host_blocks(config: RunSpec, shards: int) -> None:
    """Every host packs the whole batch and passes rows [p*R/P, (p+1)*R/P) as its share, with
    indices into the global rows: that needs process p's devices to hold exactly that block of
    the batch axis (true of the meshes make_mesh builds; checked, since a mismatch would train
    on the wrong rows silently)."""
    count = jax.process_count()
    if count == 1:
        return
    mesh = sharding.make_mesh(config.mesh)
    if shards % count:
        raise config_lib.ConfigError(f"data.pack=True: the batch shards ({shards}) do not split over "
                                     f"{count} processes; set --config.data.pack=false")
    block = shards // count
    for device, index in sharding.batch_sharding(mesh, 1).devices_indices_map((shards,)).items():
        if (index[0].start or 0) // block != device.process_index:
            raise config_lib.ConfigError(
                "data.pack=True: this mesh does not give each process a contiguous block of the "
                "batch in process order, which packed batches need; set --config.data.pack=false")


def task_pipeline(config: RunSpec, features: dict[str, np.ndarray], *, train: bool,
                  batch_size: int | None = None, num_batches: int | None = None,
                  datasets: tuple[tuple[int, ...], str] = ((), "")) -> FeaturePipeline:
    """Batches of a fine-tuning task's features (packed when data.pack), this host's share;
    `datasets` as Task.train_datasets gives them (training on several files)."""
    blocks, mix = datasets
    return FeaturePipeline(features, batch_size=batch_size or config.train.batch_size, train=train,
                           seed=config.seed if train else 0, process_index=jax.process_index(),
                           process_count=jax.process_count(), num_batches=num_batches,
                           pack=pack_options(config, train), blocks=blocks,
                           mix=mix or "proportional")


def make(config: RunSpec, split: str, *, batch_size: int | None = None, num_batches: int | None = None,
         task=None):
    """The data pipeline of `config.data` for `split` ('train' or 'validation'), reading
    only this host's share; fine-tuning data comes from `task` (tasks.from_config)."""
    spec = specs.data(config.data)
    global_batch = batch_size or config.train.batch_size
    own = objectives.for_config(config).pipeline(config, split, batch_size=global_batch,
                                                 num_batches=num_batches, task=task)
    if own is not None:  # an objective with batches of its own
        return own
    if spec.finetuning:
        if task is None:
            raise ValueError(f"data.name={spec.task!r} is a fine-tuning task: pass its Task "
                             "(tasks.from_config) as `task`")
        train = split == "train"
        return task_pipeline(config, task.features("train" if train else task.eval_splits[0]),
                             train=train, batch_size=global_batch, num_batches=num_batches,
                             datasets=task.train_datasets() if train else ((), ""))
    source = sources.get(spec.source)
    if source.kind == "pairs":
        return translation_pipeline(config, split, batch_size=global_batch, num_batches=num_batches)
    if source.kind == "batches":
        return source.batches(config, split, batch_size=global_batch, num_batches=num_batches,
                              process_index=jax.process_index(), process_count=jax.process_count())
    d = spec.keys
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_lib.required_dir(d.tokenizer))
    tokenizer.check_fits(config.model.vocab_size, f"data.tokenizer={d.tokenizer}")
    docs, ids = open_documents(config, split, tokenizer)
    data = d
    if split != "train":  # held-out batches mask at the evaluation rate
        data = dataclasses.replace(d, masked_lm_prob=d.eval_masked_lm_prob or d.masked_lm_prob)
    return PretrainingPipeline(
        docs, ids, tokenizer, data, seed=config.seed,
        batch_size=global_batch // jax.process_count(), train=split == "train",
        process_index=jax.process_index(), process_count=jax.process_count(),
        num_batches=num_batches)
