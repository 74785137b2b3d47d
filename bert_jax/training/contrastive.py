"""Contrastive objectives of sentence-embedding models (model.name=bert_embedding), as
sentence-transformers' losses: `contrastive` (MultipleNegativesRankingLoss, InfoNCE),
`contrastive_symmetric` (MultipleNegativesSymmetricRankingLoss) and `cosent` (CoSENTLoss, for
pairs with a score); model.matryoshka_dims turns each into its MatryoshkaLoss.

The negative pool is the global batch. The loss is one function of every query and document
embedding of the step's batch, so under jit with the batch sharded over the mesh's data axes
XLA gathers the documents from every device and host: 8 devices give the loss and gradient of
one device holding the whole batch (tests/unit/training/test_contrastive.py). With
train.grad_accum_steps = k the batch is embedded in k chunks without a gradient, the loss's
gradient is taken with respect to the embeddings, then each chunk is run again and its
gradient pulled back through it (GradCache, Gao et al. 2021, sentence-transformers' Cached*
losses): activation memory is one chunk's, the negative pool still the whole batch, and the
gradient that of the whole batch (the same dropout key per chunk in both passes).

Batches (tasks/pairs.py): query_{input_ids, token_type_ids, attention_mask} [B, T], the same
of the documents [B, N, T] (N = 1 + data.num_negatives: the positive, then hard negatives),
`score` [B] for scored pairs (cosent), optional example_weight [B] (0: an eval batch's padding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bert_jax import models, specs
from bert_jax.config import ConfigError
from bert_jax.specs import RunSpec
from bert_jax.training import objectives

Array = jax.Array
_TEXT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
_SIDES = ("query", "document")


def _unit(x: Array) -> Array:
    """Rows over max(norm, 1e-12): sentence-transformers' cos_sim normalisation."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def text_keys(ids: Array) -> Array:
    """A number per text from its token ids [..., T] -> [...]: equal texts get equal numbers,
    different ones almost never (a hash mod 2**32), so a text repeated in a batch is found."""
    weights = jnp.arange(1, ids.shape[-1] + 1, dtype=jnp.uint32) * jnp.uint32(2654435761)
    return jnp.sum(ids.astype(jnp.uint32) * weights, axis=-1, dtype=jnp.uint32)


def info_nce(q_BD: Array, d_BND: Array, w_B: Array, scale: Array, symmetric: bool,
             query_keys: Array | None = None, document_keys: Array | None = None
             ) -> tuple[Array, Array]:
    """(summed loss, number of queries whose positive scores highest) of the multiple-negatives
    ranking loss: each query against every document of the batch (the positives and the hard
    negatives of all queries), its own positive the label; symmetric: the mean of that and each
    positive against every query. Padding examples (w = 0) neither count nor compete. With the
    texts' keys (text_keys [B], [B, N]), a document equal to a query's positive is not its
    negative, nor the positive of another row of the same query (a query with several relevant
    documents, as BEIR's qrels give), nor (symmetric) a query equal to a positive's query, or
    whose positive equals it: sentence-transformers leaves such batches to its
    NoDuplicatesBatchSampler, while SQuAD's questions share paragraphs."""
    B, N, _ = d_BND.shape
    q, d = _unit(q_BD), _unit(d_BND.reshape(B * N, -1))
    live = jnp.repeat(w_B > 0, N)  # [B*N] documents that compete
    target = jnp.arange(B) * N
    logits = jnp.where(live[None, :], scale * (q @ d.T), -jnp.inf)  # [B, B*N]
    not_own = jnp.arange(B * N)[None, :] != target[:, None]
    if document_keys is not None:
        flat = document_keys.reshape(B * N)
        copy = (flat[None, :] == flat[target][:, None]) & not_own
        logits = jnp.where(copy, -jnp.inf, logits)
    if query_keys is not None:  # the positive of another row of the same query: also relevant
        own = jnp.repeat(query_keys, N)  # [B*N] the query each document belongs to
        positive = (jnp.arange(B * N) % N == 0)[None, :]
        logits = jnp.where(positive & (own[None, :] == query_keys[:, None]) & not_own, -jnp.inf,
                           logits)
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce_B = -logp[jnp.arange(B), target]
    others = jnp.where(jnp.arange(B * N)[None, :] == target[:, None], -jnp.inf, logits)
    ok_B = (logits[jnp.arange(B), target] > others.max(-1)).astype(jnp.float32)
    if symmetric:  # each positive against every query
        back = jnp.where((w_B > 0)[None, :], scale * (d[target] @ q.T), -jnp.inf)  # [B, B]
        if query_keys is not None and document_keys is not None:
            pos = document_keys.reshape(B * N)[target]
            same = (query_keys[None, :] == query_keys[:, None]) | (pos[None, :] == pos[:, None])
            back = jnp.where(same & ~jnp.eye(B, dtype=bool), -jnp.inf, back)
        ce_B = (ce_B - jax.nn.log_softmax(back, axis=-1)[jnp.arange(B), jnp.arange(B)]) / 2
    return jnp.sum(jnp.where(w_B > 0, ce_B, 0.0) * w_B), jnp.sum(ok_B * w_B)


def cosent(q_BD: Array, d_BD: Array, score_B: Array, w_B: Array, scale: Array) -> Array:
    """CoSENT (Su 2022): log(1 + sum over pairs (i, j) with score_i > score_j of
    exp(scale (cos_j - cos_i))), over the batch's real pairs."""
    cos_B = jnp.sum(_unit(q_BD) * _unit(d_BD), -1) * scale
    diff = cos_B[None, :] - cos_B[:, None]  # [i, j]: cos_j - cos_i
    live = (w_B[:, None] > 0) & (w_B[None, :] > 0) & (score_B[:, None] > score_B[None, :])
    return jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1), jnp.where(live, diff, -jnp.inf).ravel()]))


class _Contrastive(objectives.Objective):
    """Embeds a batch's queries and documents and compares them; subclasses say how."""

    packing = None  # a text is a whole row
    term = "contrastive"
    scored = False  # whether batches carry a `score` per pair

    def __init__(self, model_cfg: Mapping[str, Any]):
        super().__init__(model_cfg)
        cfg = models.split_model_config(model_cfg)[1]  # the typed fields, defaults from there
        self.dims = cfg.matryoshka_dims or (cfg.emb_dim,)
        self.scale = cfg.similarity_scale

    def check(self, config: RunSpec) -> None:
        """A batch the loss learns from: in-batch negatives need a second pair when no hard
        negatives are given (one pair alone has no negative: loss 0), CoSENT a second pair to
        rank against, and reads no negatives."""
        model = config.model
        # (a training check, not the model config's: a checkpoint saved before the cap was
        # refused, which started at 150 and was clipped to 100, still reads)
        if model.learn_scale and model.similarity_scale > models.config.LEARNED_SCALE_CAP:
            cap = models.config.LEARNED_SCALE_CAP
            raise ConfigError(f"model.similarity_scale={model.similarity_scale:g} is above the "
                              f"learned scale's cap {cap:g} (model.learn_scale=True); start it at "
                              f"most at {cap:g}, or set learn_scale=False for a fixed scale")
        negatives = specs.data(config.data).keys.num_negatives
        if self.scored and negatives:
            raise ConfigError(f"data.num_negatives={negatives}: train.objective="
                              f"{self.objective_name!r} trains on scored pairs and reads no "
                              "negatives; set --config.data.num_negatives=0")
        if config.train.batch_size < 2 and (self.scored or not negatives):
            raise ConfigError(
                f"train.batch_size={config.train.batch_size}: train.objective="
                f"{self.objective_name!r} " + (
                    "ranks the pairs of a batch against each other" if self.scored else
                    "takes a query's negatives from the other pairs of its batch (none given: "
                    "data.num_negatives=0)") + "; set train.batch_size >= 2")

    def documents(self, config: RunSpec) -> int:
        """Documents per query in a training batch: the positive and data.num_negatives."""
        return 1 if self.scored else 1 + specs.data(config.data).keys.num_negatives

    def batch_spec(self, config: RunSpec, rows: int | None = None) -> objectives.Spec:
        B, T = config.train.batch_size, config.data.max_seq_length
        N = self.documents(config)
        spec = {f"query_{k}": jax.ShapeDtypeStruct((B, T), jnp.int32) for k in _TEXT_KEYS}
        spec |= {f"document_{k}": jax.ShapeDtypeStruct((B, N, T), jnp.int32) for k in _TEXT_KEYS}
        if self.scored:
            spec["score"] = jax.ShapeDtypeStruct((B,), jnp.float32)
        return spec

    def evaluator(self, config: RunSpec) -> str:
        return "task"

    def embed(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
              ) -> dict[str, Array]:
        """{"query": [B, D], "document": [B, N, D]}: both sides in one pass of the encoder."""
        q = {k: batch[f"query_{k}"] for k in _TEXT_KEYS}
        d = {k: batch[f"document_{k}"] for k in _TEXT_KEYS}
        B, N, T = d["input_ids"].shape
        both = {k: jnp.concatenate([q[k], d[k].reshape(B * N, T)]) for k in _TEXT_KEYS}
        vec = model(both.pop("input_ids"), rng=rng, **both)["embedding"]
        return {"query": vec[:B], "document": vec[B:].reshape(B, N, -1)}

    def forward(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                ) -> dict[str, Array]:
        """The embeddings, and the similarity scale the loss uses (learned or fixed)."""
        return self.forward_from(self.embed(model, batch, rng), model)

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        return {self.term: jnp.sum(objectives._example_weight(batch, "query_input_ids"))}

    def loss(self, out: dict[str, Array], batch: dict[str, Array]
             ) -> tuple[objectives.Terms, objectives.Metrics]:
        """The loss summed over the Matryoshka dimensions (one: the whole vector), as a sum over
        the batch's examples (the engine divides by `weights`)."""
        w_B = objectives._example_weight(batch, "query_input_ids")
        n = jnp.sum(w_B)
        total, metrics = 0.0, {}
        for dim in self.dims:
            q, d = out["query"][..., :dim], out["document"][..., :dim]
            value, more = self.loss_at(q, d, out["scale"][0], batch, w_B)
            total += value
            suffix = "" if dim == self.dims[0] else f"@{dim}"
            metrics |= {f"{k}{suffix}": v for k, v in more.items()}
        metrics["similarity_scale"] = (out["scale"][0] * n, n)
        return {self.term: total}, metrics

    def loss_at(self, q_BD, d_BND, scale, batch, w_B) -> tuple[Array, objectives.Metrics]:
        raise NotImplementedError

    def __call__(self, model: nnx.Module, batch: dict[str, Array], rng: Array | None
                 ) -> tuple[objectives.Terms, objectives.Metrics]:
        return self.loss(self.forward(model, batch, rng), batch)

    def tokens(self, batch: dict[str, Array]) -> Array:
        return sum(jnp.sum(batch[f"{s}_attention_mask"].astype(jnp.float32)) for s in _SIDES)

    def flops(self, batch: dict[str, Array]) -> Array:
        T = batch["query_input_ids"].shape[-1]
        return 3 * self.flops_per_token(T)["encoder_per_token"] * self.tokens(batch)

    def chunked_value_and_grad(self, graphdef, params, micro: dict[str, Array], rng: Array,
                               denominators: dict[str, Array]):
        """GradCache over the k chunks of `micro` ([k, B/k, ...]): ((loss, metrics), grads) of
        the whole batch, one chunk's activations at a time."""
        k = jax.tree.leaves(micro)[0].shape[0]

        def embed(p, mb, i):
            return self.embed(nnx.merge(graphdef, p), mb, jax.random.fold_in(rng, i))

        # 1. Every chunk's embeddings, without a gradient.
        _, vecs = jax.lax.scan(lambda c, xs: (c, embed(params, xs[1], xs[0])), None,
                               (jnp.arange(k), micro))
        whole = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), (vecs, micro))

        # 2. The loss of the whole batch and its gradient on the embeddings (and the scale).
        def loss_of(v, p):
            out = self.forward_from(v, nnx.merge(graphdef, p))
            terms, metrics = self.loss(out, whole[1])
            return sum(terms[t] / denominators[t] for t in terms), metrics

        (loss, metrics), (g_vecs, g_params) = jax.value_and_grad(
            loss_of, argnums=(0, 1), has_aux=True)(whole[0], params)
        g_vecs = jax.tree.map(lambda g, x: g.reshape(x.shape), g_vecs, vecs)

        # 3. Each chunk again, its embeddings' gradient pulled back to the parameters.
        def back(acc, xs):
            i, mb, g = xs
            _, pull = jax.vjp(lambda p: embed(p, mb, i), params)
            return optax.tree.add(acc, pull(g)[0]), None

        grads, _ = jax.lax.scan(back, g_params, (jnp.arange(k), micro, g_vecs))
        return (loss, metrics), grads

    def forward_from(self, vecs: dict[str, Array], model: nnx.Module) -> dict[str, Array]:
        """forward's outputs from embeddings already computed (GradCache's second step)."""
        log_scale = getattr(model, "log_scale", None)
        # a learned scale stays at most the cap (a start above it is refused in the config)
        cap = jnp.log(models.config.LEARNED_SCALE_CAP)
        scale = (jnp.exp(jnp.minimum(log_scale[...], cap)) if log_scale is not None
                 else jnp.float32(self.scale))
        # one per example, as evaluation keeps every output by example
        return {**vecs, "scale": jnp.broadcast_to(scale, vecs["query"].shape[:1])}


@objectives.register("contrastive", models=("bert_embedding",), default_for=("bert_embedding",))
class MultipleNegativesRanking(_Contrastive):
    """InfoNCE over the global batch: each query's positive against every document of the
    batch (in-batch and hard negatives); `contrastive_accuracy`: the share of queries whose
    positive scores highest."""

    symmetric = False

    def loss_at(self, q_BD, d_BND, scale, batch, w_B):
        keys = {f"{side}_keys": text_keys(batch[f"{side}_input_ids"]) for side in _SIDES
                if f"{side}_input_ids" in batch}
        loss, ok = info_nce(q_BD, d_BND, w_B, scale, self.symmetric, **keys)
        return loss, {"contrastive_accuracy": (ok, jnp.sum(w_B))}


@objectives.register("contrastive_symmetric", models=("bert_embedding",))
class SymmetricRanking(MultipleNegativesRanking):
    """The mean of InfoNCE query -> documents and positive -> queries."""

    symmetric = True


@objectives.register("cosent", models=("bert_embedding",))
class CoSENT(_Contrastive):
    """CoSENT on pairs with a score (STS): every pair of pairs ranked by their cosines as by
    their scores; its term is the batch's loss times its pair count (the engine divides)."""

    term, scored = "cosent", True

    def loss_at(self, q_BD, d_BND, scale, batch, w_B):
        if "score" not in batch:  # evaluation pairs without scores: nothing to rank
            return 0.0, {}
        loss = cosent(q_BD, d_BND[:, 0], batch["score"].astype(jnp.float32), w_B, scale)
        return loss * jnp.sum(w_B), {}

    def weights(self, batch: dict[str, Array]) -> dict[str, Array]:
        # Pairs without scores (evaluation): no pair counts toward the loss, which is then none.
        return super().weights(batch) if "score" in batch else {self.term: jnp.float32(0)}
