"""Training objectives: a model and a batch -> loss terms and metrics.

An objective returns `(terms, metrics)`:
  terms   {name: summed loss}; the train step divides each by `weights(batch)[name]`, the
          term's total weight over the whole (global, all-microbatch) batch, so k
          accumulated microbatches give exactly the loss of one big batch;
  metrics {name: (sum, count)}, reported as sum / count after summing over microbatches,
          devices and eval batches.
Batches use the original BERT feature names (input_ids, input_mask, segment_ids,
masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels, label_ids);
`example_weight` (0 for padding examples of the last eval batch) is optional.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array
Terms = dict[str, Array]
Metrics = dict[str, tuple[Array, Array]]


def _example_weight(batch: dict[str, Array]) -> Array:
    return batch.get("example_weight", jnp.ones(batch["input_ids"].shape[0], jnp.float32))


def _cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Per-position cross-entropy and correctness, in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return ce, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def _bert_inputs(batch: dict[str, Array]) -> dict[str, Array]:
    return {"token_type_ids": batch["segment_ids"], "attention_mask": batch["input_mask"]}


class Pretraining:
    """BERT MLM + NSP: mean cross-entropy over the masked positions plus mean NSP
    cross-entropy (the original run_pretraining.py loss)."""

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        return {"masked_lm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
                "next_sentence": jnp.sum(_example_weight(batch))}

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[Terms, Metrics]:
        out = model(batch["input_ids"], masked_positions=batch["masked_lm_positions"], rng=rng,
                    **_bert_inputs(batch))
        w_BP = batch["masked_lm_weights"].astype(jnp.float32)
        ce_BP, ok_BP = _cross_entropy(out["mlm_logits"], batch["masked_lm_ids"])
        w_B = _example_weight(batch)
        nsp_B, nsp_ok_B = _cross_entropy(out["nsp_logits"], batch["next_sentence_labels"])
        mlm_sum, nsp_sum = jnp.sum(ce_BP * w_BP), jnp.sum(nsp_B * w_B)
        n_mlm, n_ex = jnp.sum(w_BP), jnp.sum(w_B)
        metrics = {"masked_lm_loss": (mlm_sum, n_mlm),
                   "masked_lm_accuracy": (jnp.sum(ok_BP * w_BP), n_mlm),
                   "next_sentence_loss": (nsp_sum, n_ex),
                   "next_sentence_accuracy": (jnp.sum(nsp_ok_B * w_B), n_ex)}
        return {"masked_lm": mlm_sum, "next_sentence": nsp_sum}, metrics


class _FineTuning:
    """A task head's objective, split so evaluation can keep the model outputs:
    `forward` (model outputs) then `loss` (terms and metrics of those outputs)."""

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        return {"task": jnp.sum(_example_weight(batch))}

    def forward(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                ) -> dict[str, Array]:
        return model(batch["input_ids"], rng=rng, **_bert_inputs(batch))

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[Terms, Metrics]:
        return self.loss(self.forward(model, batch, rng), batch)


class Classification(_FineTuning):
    """Sentence / pair classification (cross-entropy), or regression (MSE) when the model
    has one output."""

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


class MultipleChoice(Classification):
    """One score per choice ([B, C, T] inputs), softmax cross-entropy over the choices."""


class Tagging(_FineTuning):
    """Token tags: cross-entropy at the positions with label_weights > 0 (first sub-tokens),
    averaged over those positions."""

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


class SpanQA(_FineTuning):
    """SQuAD: (start cross-entropy + end cross-entropy) / 2 over the sequence positions, as
    the original run_squad.py."""

    def loss(self, out: dict[str, Array], batch: dict[str, Array]) -> tuple[Terms, Metrics]:
        if "start_positions" not in batch:  # evaluation features: scored by the official script
            return {}, {}
        w_B = _example_weight(batch)
        start_B, start_ok = _cross_entropy(out["start_logits"], batch["start_positions"])
        end_B, end_ok = _cross_entropy(out["end_logits"], batch["end_positions"])
        n = jnp.sum(w_B)
        return ({"task": jnp.sum((start_B + end_B) / 2 * w_B)},
                {"span_accuracy": (jnp.sum(start_ok * end_ok * w_B), n)})


OBJECTIVES = {
    "bert_pretraining": Pretraining,
    "bert_classification": Classification,
    "bert_choice": MultipleChoice,
    "bert_tagging": Tagging,
    "bert_span": SpanQA,
}


def for_model(model_name: str):
    """The objective that trains model `model_name` (MODELS registry name)."""
    if model_name not in OBJECTIVES:
        raise ValueError(f"no training objective for model.name={model_name!r} yet; "
                         f"trainable: {sorted(OBJECTIVES)}")
    return OBJECTIVES[model_name]()
