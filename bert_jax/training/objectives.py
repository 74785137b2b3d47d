"""Training objectives: what a batch looks like, its loss terms and metrics, and the real
tokens and model FLOPs it holds. Registered by name (`register`); a run trains
train.objective, empty meaning its model's default (DEFAULTS: one per model name).

Every objective (`for_model(model_cfg, name=...)`) has:
  batch_spec(config)        {name: ShapeDtypeStruct} of a global training batch (the planner
                            and the train loop compile from it, before any data is read);
                            packed fine-tuning batches vary in rows: batch_spec(config, rows)
  __call__(model, batch, rng) -> (terms, metrics)
        terms   {name: summed loss}; the train step divides each by `weights(batch)[name]`,
                the term's total weight over the whole (global, all-microbatch) batch, so k
                accumulated microbatches give exactly the loss of one big batch;
        metrics {name: (sum, count)}, reported as sum / count after summing over
                microbatches, devices and eval batches;
  weights(batch)            {term: total weight}
  tokens(batch)             real (not padding) input tokens of the batch, a scalar
  flops(batch)              training matmul FLOPs of the batch (3x forward), real tokens only
  pipeline(config, split, ...) its own host batches, or None (the default): the batches of
                            the run's data source or fine-tuning task (training/input.py)
Fine-tuning objectives also split __call__ into `forward` (model outputs, kept by
evaluation) and `loss`.

Batches are in the layouts of data/packing.py. BERT: input_ids, token_type_ids and either
attention_mask (unpacked) or segment_ids + positions (packed rows), plus the original
labels (masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels,
label_ids); packed pretraining rows (data.pack) hold several instances' NSP labels as
next_sentence_labels/_positions/_weights [B, S]; an MLM-only model (model.nsp=False) has no
NSP labels at all. Sequence batches (transformer, decoder_lm):
`inputs`/`targets` with optional `<x>_segment_ids` (0 = padding, else the packed sequence's
id) and `<x>_positions`. `example_weight` (0 for padding examples of the last eval batch) is
optional. Every objective's `packing` says how its packed batches are read: "cls", "tokens",
"rows" (data/packing.py), or None when they are never packed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax import models, specs
from bert_jax.config import ConfigError, model_config
from bert_jax.data import packing as packing_lib
from bert_jax.specs import RunSpec

Array = jax.Array
Terms = dict[str, Array]
Metrics = dict[str, tuple[Array, Array]]
Spec = dict[str, jax.ShapeDtypeStruct]


def _example_weight(batch: dict[str, Array], key: str = "input_ids") -> Array:
    if "example_weight" in batch:
        return batch["example_weight"]
    # Packed batches have fewer rows than examples; cls_index has one entry per example.
    n = batch["cls_index" if "cls_index" in batch else key].shape[0]
    return jnp.ones(n, jnp.float32)


def _cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Per-position cross-entropy and correctness, in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    label_logp = jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    # Correct when the label scores above every other class (argmax is a slow reduction on
    # CPU); a tie counts as wrong (argmax would pick the lower id).
    others = jnp.where(jnp.arange(logp.shape[-1]) == labels[..., None], -jnp.inf, logp)
    return -label_logp, (label_logp > jnp.max(others, axis=-1)).astype(jnp.float32)


def _spec(shape: tuple[int, ...], dtype=jnp.int32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


class Objective:
    """What every objective shares: the model config it trains, its FLOPs per token, and how
    its packed batches are read (`packing`: "cls", "tokens", "rows" or None; data/packing.py).
    `register` sets its name (train.objective) and the models it trains."""

    packing: str | None = None
    objective_name: str = ""
    models: tuple[str, ...] = ()

    def __init__(self, model_cfg: Mapping[str, Any]):
        self.model_cfg = dict(model_cfg)

    def flops_per_token(self, seq_len: int) -> dict[str, float]:
        return models.flops_per_token(self.model_cfg, seq_len)

    def rows_vary(self, config: RunSpec) -> bool:
        """Whether this run's batches come in several row counts (packed fine-tuning)."""
        return False

    def check(self, config: RunSpec) -> None:
        """A ConfigError for a training config this objective cannot learn from (setup.check,
        before the mesh's and the data's checks); none by default."""

    def evaluator(self, config: RunSpec) -> str:
        """The kind of evaluator (evaluate.EVALUATORS) for runs without a fine-tuning task."""
        return "loss"

    def pipeline(self, config: RunSpec, split: str, *, batch_size: int,
                 num_batches: int | None, task=None):
        """This host's batches of `split` ('train' or 'validation') in this objective's layout,
        `batch_size` rows a global batch, when the objective makes its own (an iterator with
        get_state()/set_state(), as training/input.py's); None: those of the run's data source
        or fine-tuning task, read by training/input.py."""
        return None


# objective name -> class; model.name -> the name of the objective that trains it by default.
OBJECTIVES: dict[str, type[Objective]] = {}
DEFAULTS: dict[str, str] = {}


def register(name: str, *, models: tuple[str, ...], default_for: tuple[str, ...] = ()):
    """Class decorator: registers an objective under `name` (train.objective), for the models it
    trains (`models`: model names) and as the default objective of `default_for` of them. A new
    objective is one such class in any module imported before the run (a test file will do)."""
    def add(cls: type[Objective]) -> type[Objective]:
        cls.objective_name, cls.models = name, tuple(models)
        OBJECTIVES[name] = cls
        DEFAULTS.update({model: name for model in default_for})
        return cls
    return add


# A BERT batch's arrays the model takes by name: unpacked, and packed rows (data/packing.py).
_UNPACKED_INPUTS = ("token_type_ids", "attention_mask")
_PACKED_INPUTS = ("token_type_ids", "segment_ids", "positions", "cls_index")


class _Bert(Objective):
    """BERT inputs: input_ids, token_type_ids, attention_mask ([B, T] or [B, C, T]); packed
    batches (packing.pack_batch, pretraining.pack_row) hold input_ids and token_type_ids as
    [R, T] rows with segment_ids and positions instead of attention_mask, and `cls_index`
    (and for tagging `token_index`)."""

    @staticmethod
    def inputs(batch: dict[str, Array]) -> dict[str, Array]:
        """The model's keyword inputs of the batch (the names match)."""
        names = _PACKED_INPUTS if "segment_ids" in batch else _UNPACKED_INPUTS
        return {k: batch[k] for k in names if k in batch}

    @staticmethod
    def input_spec(shape: tuple[int, ...]) -> Spec:
        return {k: _spec(shape) for k in ("input_ids", *_UNPACKED_INPUTS)}

    @staticmethod
    def packed_spec(config: RunSpec, rows: int | None, example_shape: tuple[int, ...],
                    token_index: bool = False) -> Spec:
        """The token arrays of a packed batch of [R, T] rows (R: `rows`, default the most a
        batch can need) and the indices of its examples ([B] or [B, C])."""
        T = config.data.max_seq_length
        R = rows or math.prod(example_shape)  # at most one sequence per row
        spec = {**{k: _spec((R, T)) for k in packing_lib.ROW_KEYS}, "cls_index": _spec(example_shape)}
        if token_index:
            spec["token_index"] = _spec((*example_shape, T))
        return spec

    def tokens(self, batch: dict[str, Array]) -> Array:
        return jnp.sum(packing_lib.real_tokens(batch).astype(jnp.float32))

    def flops(self, batch: dict[str, Array]) -> Array:
        per_token = self.flops_per_token(batch["input_ids"].shape[-1])["encoder_per_token"]
        return 3 * per_token * self.tokens(batch)


@register("pretraining", models=("bert_pretraining",), default_for=("bert_pretraining",))
class Pretraining(_Bert):
    """BERT MLM + NSP: mean cross-entropy over the masked positions plus mean NSP
    cross-entropy (the original run_pretraining.py loss). With data.pack, a row holds up to
    S = data.max_instances_per_row instances (data/pretraining.pack_row): NSP labels, their
    [CLS] positions and weights are [B, S], and every instance counts once in the means.
    With model.nsp=False (RoBERTa, ModernBERT) the masked LM alone: no NSP labels, term or
    metrics; its rows are data.instances "full_rows" or "packed" (packed rows, no [CLS] index)."""

    packing = "rows"

    def __init__(self, model_cfg: Mapping[str, Any]):
        super().__init__(model_cfg)
        self.nsp = bool(self.model_cfg.get("nsp", True))

    def packs(self, config: RunSpec) -> bool:
        # max_instances_per_row and which instances pack: config.check_pretraining_data
        return specs.data(config.data).keys.packed

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        P = config.data.max_predictions_per_seq
        packed = self.packs(config)
        tokens = ({k: _spec((B, T)) for k in packing_lib.ROW_KEYS} if packed
                  else self.input_spec((B, T)))
        spec = {**tokens, "masked_lm_positions": _spec((B, P)),
                "masked_lm_ids": _spec((B, P)), "masked_lm_weights": _spec((B, P), jnp.float32)}
        if not self.nsp:
            return spec
        spec["next_sentence_labels"] = _spec((B,))
        if packed:
            S = config.data.max_instances_per_row
            spec |= {"next_sentence_labels": _spec((B, S)), "next_sentence_positions": _spec((B, S)),
                     "next_sentence_weights": _spec((B, S), jnp.float32)}
        return spec

    def flops(self, batch: dict[str, Array]) -> Array:
        head = self.flops_per_token(batch["input_ids"].shape[-1])["mlm_head_per_predicted_token"]
        predicted = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
        return super().flops(batch) + 3 * head * predicted

    @staticmethod
    def _nsp_weight(batch: dict[str, Array]) -> Array:
        """Per NSP label ([B] or packed [B, S]): 0 for empty slots and padding examples."""
        w = _example_weight(batch)
        if "next_sentence_weights" in batch:
            w = batch["next_sentence_weights"] * w[:, None]
        return w

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        w = {"masked_lm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))}
        if self.nsp:
            w["next_sentence"] = jnp.sum(self._nsp_weight(batch))
        return w

    def forward(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                ) -> dict[str, Array]:
        """mlm_logits [B, P, V] and with NSP nsp_logits [B, 2] (packed: [B, S, 2])."""
        inputs = self.inputs(batch)
        if self.nsp and "segment_ids" in batch:  # each instance's [CLS] as an index into all B*T tokens
            B, T = batch["input_ids"].shape
            inputs["cls_index"] = batch["next_sentence_positions"] + T * jnp.arange(B)[:, None]
        return model(batch["input_ids"], masked_positions=batch["masked_lm_positions"], rng=rng,
                     **inputs)

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[Terms, Metrics]:
        out = self.forward(model, batch, rng)
        w_BP = batch["masked_lm_weights"].astype(jnp.float32)
        ce_BP, ok_BP = _cross_entropy(out["mlm_logits"], batch["masked_lm_ids"])
        mlm_sum, n_mlm = jnp.sum(ce_BP * w_BP), jnp.sum(w_BP)
        terms = {"masked_lm": mlm_sum}
        metrics = {"masked_lm_loss": (mlm_sum, n_mlm),
                   "masked_lm_accuracy": (jnp.sum(ok_BP * w_BP), n_mlm)}
        if not self.nsp:
            return terms, metrics
        w_B = self._nsp_weight(batch)  # [B], or [B, S] packed
        nsp_B, nsp_ok_B = _cross_entropy(out["nsp_logits"], batch["next_sentence_labels"])
        nsp_sum, n_ex = jnp.sum(nsp_B * w_B), jnp.sum(w_B)
        terms["next_sentence"] = nsp_sum
        metrics |= {"next_sentence_loss": (nsp_sum, n_ex),
                    "next_sentence_accuracy": (jnp.sum(nsp_ok_B * w_B), n_ex)}
        return terms, metrics


class _FineTuning(_Bert):
    """A task head's objective, split so evaluation can keep the model outputs:
    `forward` (model outputs) then `loss` (terms and metrics of those outputs).
    `packing`: what a packed batch needs to find its examples ("cls": each [CLS]; "tokens":
    every token), or None when the head is not packed (SQuAD's windows are full length, and
    its span softmax runs over the whole row)."""

    def packs(self, config: RunSpec) -> bool:
        """Whether this run's batches are packed (data.pack and a head that can be)."""
        return specs.data(config.data).keys.pack and self.packing is not None

    def rows_vary(self, config: RunSpec) -> bool:
        return self.packs(config)

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        return {"task": jnp.sum(_example_weight(batch))}

    def forward(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                ) -> dict[str, Array]:
        return model(batch["input_ids"], rng=rng, **self.inputs(batch))

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[Terms, Metrics]:
        return self.loss(self.forward(model, batch, rng), batch)


@register("classification", models=("bert_classification",), default_for=("bert_classification",))
class Classification(_FineTuning):
    """Sentence / pair classification (cross-entropy), or regression (MSE) when the model
    has one output."""

    packing = "cls"

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        regression = self.model_cfg.get("num_labels") == 1
        tokens = (self.packed_spec(config, rows, (B,)) if self.packs(config)
                  else self.input_spec((B, T)))
        return {**tokens, "label_ids": _spec((B,), jnp.float32 if regression else jnp.int32)}

    def loss(self, out: dict[str, Array], batch: dict[str, Array]) -> tuple[Terms, Metrics]:
        logits_BC, w_B = out["logits"], _example_weight(batch)
        n = jnp.sum(w_B)
        if logits_BC.shape[-1] == 1:
            err_B = (logits_BC[:, 0] - batch["label_ids"].astype(jnp.float32)) ** 2
            loss_sum = jnp.sum(err_B * w_B)
            return {"task": loss_sum}, {"loss_mse": (loss_sum, n)}
        ce_B, ok_B = _cross_entropy(logits_BC, batch["label_ids"])
        loss_sum = jnp.sum(ce_B * w_B)
        return {"task": loss_sum}, {"accuracy": (jnp.sum(ok_B * w_B), n)}


@register("multiple_choice", models=("bert_choice",), default_for=("bert_choice",))
class MultipleChoice(Classification):
    """One score per choice ([B, C, T] inputs), softmax cross-entropy over the choices."""

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, C, T = config.train.batch_size, config.data.num_choices, config.data.max_seq_length
        tokens = (self.packed_spec(config, rows, (B, C)) if self.packs(config)
                  else self.input_spec((B, C, T)))
        return {**tokens, "label_ids": _spec((B,))}


@register("tagging", models=("bert_tagging",), default_for=("bert_tagging",))
class Tagging(_FineTuning):
    """Token tags: cross-entropy at the positions with label_weights > 0 (first sub-tokens),
    averaged over those positions."""

    packing = "tokens"

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        tokens = (self.packed_spec(config, rows, (B,), token_index=True) if self.packs(config)
                  else self.input_spec((B, T)))
        return {**tokens, "label_ids": _spec((B, T)), "label_weights": _spec((B, T), jnp.float32)}

    def forward(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                ) -> dict[str, Array]:
        out = super().forward(model, batch, rng)
        if "token_index" in batch:  # packed rows -> each example's tokens [B, T, tags]
            logits = out["logits"]
            out["logits"] = logits.reshape(-1, logits.shape[-1])[batch["token_index"]]
        return out

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        return {"task": jnp.sum(self._w(batch))}

    @staticmethod
    def _w(batch: dict[str, Array]) -> Array:
        return batch["label_weights"].astype(jnp.float32) * _example_weight(batch)[:, None]

    def loss(self, out: dict[str, Array], batch: dict[str, Array]) -> tuple[Terms, Metrics]:
        w_BT = self._w(batch)
        ce_BT, ok_BT = _cross_entropy(out["logits"], batch["label_ids"])
        n = jnp.sum(w_BT)
        return {"task": jnp.sum(ce_BT * w_BT)}, {"token_accuracy": (jnp.sum(ok_BT * w_BT), n)}


@register("span_qa", models=("bert_span",), default_for=("bert_span",))
class SpanQA(_FineTuning):
    """SQuAD: (start cross-entropy + end cross-entropy) / 2 over the sequence positions, as
    the original run_squad.py."""

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        return {**self.input_spec((B, T)), "start_positions": _spec((B,)),
                "end_positions": _spec((B,))}

    def loss(self, out: dict[str, Array], batch: dict[str, Array]) -> tuple[Terms, Metrics]:
        if "start_positions" not in batch:  # evaluation features: scored by the official script
            return {}, {}
        w_B = _example_weight(batch)
        start_B, start_ok = _cross_entropy(out["start_logits"], batch["start_positions"])
        end_B, end_ok = _cross_entropy(out["end_logits"], batch["end_positions"])
        n = jnp.sum(w_B)
        return ({"task": jnp.sum((start_B + end_B) / 2 * w_B)},
                {"span_accuracy": (jnp.sum(start_ok * end_ok * w_B), n)})


def shift_right(targets_BT: Array, segments_BT: Array) -> Array:
    """Decoder inputs: each packed sequence's targets moved one step right, starting with 0
    (the pad id serves as beginning-of-sequence, as in the paper's implementation)."""
    shifted = jnp.pad(targets_BT, ((0, 0), (1, 0)))[:, :-1]
    previous = jnp.pad(segments_BT, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(segments_BT == previous, shifted, 0)


class _Sequence(Objective):
    """Token-level cross-entropy on `targets` with label smoothing (paper 5.4)."""

    def __init__(self, model_cfg: Mapping[str, Any], label_smoothing: float = 0.0):
        super().__init__(model_cfg)
        self.label_smoothing = float(label_smoothing)

    packing = "rows"

    @staticmethod
    def segments(batch: dict[str, Array], key: str) -> tuple[Array, Array]:
        """(segment ids, positions) of batch[key]: `<key>_segment_ids` and `<key>_positions` if
        present, else one sequence per row with 0 as padding."""
        ids = batch[key]
        segment_ids = batch.get(f"{key}_segment_ids", (ids != 0).astype(jnp.int32))
        positions = batch.get(f"{key}_positions",
                              jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))
        return segment_ids, positions

    def token_loss(self, logits_BTV: Array, targets_BT: Array, w_BT: Array
                   ) -> tuple[Terms, Metrics]:
        ce_BT, ok_BT = _cross_entropy(logits_BTV, targets_BT)
        loss_BT = ce_BT
        if self.label_smoothing:
            # Cross-entropy against (1 - eps) one-hot + eps uniform over the vocabulary.
            logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
            loss_BT = (1 - self.label_smoothing) * ce_BT - self.label_smoothing * jnp.mean(logp, -1)
        n = jnp.sum(w_BT)
        return ({"targets": jnp.sum(loss_BT * w_BT)},
                {"nll_loss": (jnp.sum(ce_BT * w_BT), n), "token_accuracy": (jnp.sum(ok_BT * w_BT), n)})

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        return {"targets": jnp.sum(self._w(batch))}

    def _w(self, batch: dict[str, Array]) -> Array:
        segments, _ = self.segments(batch, "targets")
        return (segments > 0).astype(jnp.float32) * _example_weight(batch, "targets")[:, None]


@register("translation", models=("transformer",), default_for=("transformer",))
class Translation(_Sequence):
    """The encoder-decoder on (inputs, targets) pairs: teacher forcing on shifted targets."""

    def evaluator(self, config: RunSpec) -> str:
        # Real parallel text also gets BLEU of decoded dev sentences; synthetic pairs only the loss.
        return "translation" if config.data.name == "translation" else "loss"

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        return {f"{k}{suffix}": _spec((B, T)) for k in ("inputs", "targets")
                for suffix in ("", "_segment_ids", "_positions")}

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[Terms, Metrics]:
        src_seg, src_pos = self.segments(batch, "inputs")
        tgt_seg, tgt_pos = self.segments(batch, "targets")
        logits = model(batch["inputs"], shift_right(batch["targets"], tgt_seg),
                       src_segments_BS=src_seg, tgt_segments_BT=tgt_seg, src_positions_BS=src_pos,
                       tgt_positions_BT=tgt_pos, rng=rng)
        return self.token_loss(logits, batch["targets"], self._w(batch))

    def tokens(self, batch: dict[str, Array]) -> Array:
        return sum(jnp.sum((self.segments(batch, k)[0] > 0).astype(jnp.float32))
                   for k in ("inputs", "targets"))

    def flops(self, batch: dict[str, Array]) -> Array:
        f = self.flops_per_token(batch["inputs"].shape[-1])
        src, tgt = (jnp.sum((self.segments(batch, k)[0] > 0).astype(jnp.float32))
                    for k in ("inputs", "targets"))
        return 3 * (f["encoder_per_source_token"] * src + f["decoder_per_target_token"] * tgt)


@register("language_model", models=("decoder_lm",), default_for=("decoder_lm",))
class LanguageModel(_Sequence):
    """The decoder-only LM: next-token prediction on `targets` (inputs = targets shifted)."""

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        return {f"targets{suffix}": _spec((B, T)) for suffix in ("", "_segment_ids", "_positions")}

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[Terms, Metrics]:
        segments, positions = self.segments(batch, "targets")
        logits, _ = model(shift_right(batch["targets"], segments), segments_BT=segments,
                          positions_BT=positions, rng=rng)
        return self.token_loss(logits, batch["targets"], self._w(batch))

    def tokens(self, batch: dict[str, Array]) -> Array:
        return jnp.sum(self._w(batch))

    def flops(self, batch: dict[str, Array]) -> Array:
        per_token = self.flops_per_token(batch["targets"].shape[-1])["decoder_per_token"]
        return 3 * per_token * self.tokens(batch)


def for_model(model_cfg: Mapping[str, Any], label_smoothing: float = 0.0, name: str = ""
              ) -> Objective:
    """The objective `name` (empty: the model's default) that trains the model of `model_cfg`
    (a config's `model` section)."""
    model = model_cfg["name"]
    if not name and model not in DEFAULTS:
        raise ConfigError(f"no training objective for model.name={model!r} (a bare encoder: "
                          f"train one of its task models); trainable: {sorted(DEFAULTS)}")
    name = name or DEFAULTS[model]
    if name not in OBJECTIVES:
        raise ConfigError(f"train.objective={name!r}; choose one of {sorted(OBJECTIVES)} (empty: "
                          f"the model's own, {DEFAULTS.get(model)!r} for model.name={model!r})")
    cls = OBJECTIVES[name]
    if model not in cls.models:
        raise ConfigError(f"train.objective={name!r} trains model.name in {list(cls.models)}, not "
                          f"{model!r}; set --config.train.objective= (empty: the model's own)")
    if issubclass(cls, _Sequence):
        return cls(model_cfg, label_smoothing)
    if label_smoothing:
        raise ConfigError(f"train.label_smoothing={label_smoothing}: model.name={model!r} has "
                          "no sequence targets to smooth; set it to 0")
    return cls(model_cfg)


def makes_own_batches(objective: Objective) -> bool:
    """Whether `objective` makes its own batches (its class defines pipeline): the run's data
    source is then not read, so its keys (data.tokenizer, data.train_files) need no value."""
    return type(objective).pipeline is not Objective.pipeline


def for_config(config: RunSpec) -> Objective:
    """The objective of a run config (train.objective for its model, compute dtype and
    train.label_smoothing)."""
    return for_model(model_config(config), config.train.label_smoothing, config.train.objective)
