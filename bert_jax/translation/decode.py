"""Greedy and beam search for the encoder-decoder Transformer, with the decoder's key/value
cache, as `jax.lax.while_loop`s that stop early; `make_translate_fn` jits either on a mesh.

Shape suffixes as in layers.py, except K: the beam size; also C = 2K candidates and
R = B*K decoder rows (row b's beams are rows b*K .. b*K+K-1).

Conventions:
- Pad id 0 is the decoder's beginning-of-sequence input and is never generated, nor are
  `banned_ids` (the vocabulary's [CLS] and [MASK], which are never targets).
- A row may generate (its source's non-pad tokens) + max_extra tokens, the paper's "input
  length + 50"; a row reaching that limit stops without EOS. All-padding rows generate none.
- Outputs are [B, S + max_extra] int32: the generated tokens, EOS included, 0 after.
- Beam score = sum log p / lp(len), GNMT's lp(len) = ((5 + len) / 6) ** alpha, where len
  counts the generated tokens including EOS; log p is the model's log-softmax (over the
  whole vocabulary, pad included) of each token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.specs import RunSpec
from bert_jax.training import sharding

Array = jax.Array
PAD = 0
NEG = -1e9  # score of dead beams and empty finished slots: finite, so sums never turn NaN


def _prepare(model, src_BS: Array, max_extra: int) -> tuple[Array, Array, Array]:
    """(source segments, encoder output, per-row length limit)."""
    seg_BS = (src_BS != PAD).astype(jnp.int32)
    n_B = seg_BS.sum(axis=1)
    limit_B = jnp.where(n_B > 0, n_B + max_extra, 0)
    return seg_BS, model.encode(src_BS, src_segments_BS=seg_BS), limit_B


def _log_probs(model, tok_B: Array, encoded_BSD: Array, seg_BS: Array, cache, i: Array,
               banned: tuple[int, ...] = ()):
    """Next-token log-probs [B, V] (pad and `banned` masked out) after input tok_B at position i."""
    logits_B1V, cache = model.decode(tok_B[:, None], encoded_BSD, seg_BS, cache=cache,
                                     cache_index=i)
    return jax.nn.log_softmax(logits_B1V[:, 0]).at[:, (PAD, *banned)].set(NEG), cache


def greedy_search(model, src_BS: Array, *, eos_id: int, max_extra: int = 50,
                  banned_ids: tuple[int, ...] = ()) -> Array:
    """[B, S + max_extra] int32: each row's argmax tokens, EOS included when produced, 0 after."""
    B, S = src_BS.shape
    T = S + max_extra
    seg_BS, encoded_BSD, limit_B = _prepare(model, src_BS, max_extra)

    def cond(carry):
        i, _, done_B, _ = carry
        return (i < T) & ~jnp.all(done_B)

    def body(carry):
        i, seq_BT1, done_B, cache = carry  # seq_BT1[:, 0] is the BOS input
        logp_BV, cache = _log_probs(model, seq_BT1[:, i], encoded_BSD, seg_BS, cache, i,
                                    banned_ids)
        tok_B = jnp.where(done_B, PAD, jnp.argmax(logp_BV, axis=-1).astype(jnp.int32))
        seq_BT1 = seq_BT1.at[:, i + 1].set(tok_B)
        return i + 1, seq_BT1, done_B | (tok_B == eos_id) | (i + 1 >= limit_B), cache

    init = (jnp.int32(0), jnp.zeros((B, T + 1), jnp.int32), limit_B == 0, model.init_cache(B, T))
    _, seq_BT1, _, _ = jax.lax.while_loop(cond, body, init)
    return seq_BT1[:, 1:]


def _gather_beams(x_BK: Array, idx_BC: Array) -> Array:
    """x[b, idx[b, c]] for arrays whose first two axes are (row, beam)."""
    return jax.vmap(lambda x, i: x[i])(x_BK, idx_BC)


def _reorder_cache(cache, parent_BK: Array):
    """Each beam takes its parent's cache: [L, R, ...] leaves gathered along the batch axis
    within each row (a batched gather, so a batch-sharded cache stays where it is)."""
    B, K = parent_BK.shape

    def gather(x_LR: Array) -> Array:
        x_LBK = x_LR.reshape(x_LR.shape[0], B, K, *x_LR.shape[2:])
        x_LBK = jax.vmap(lambda x_LK, p_K: x_LK[:, p_K], in_axes=(1, 0), out_axes=1)(x_LBK, parent_BK)
        return x_LBK.reshape(x_LR.shape)
    return jax.tree.map(gather, cache)


def beam_search(model, src_BS: Array, *, eos_id: int, beam_size: int, alpha: float,
                max_extra: int = 50, banned_ids: tuple[int, ...] = ()) -> tuple[Array, Array]:
    """(best ids [B, S + max_extra] as greedy_search's, their scores [B]).

    Each step takes the top 2K of the K alive beams' extensions. An EOS candidate goes to
    the finished set only if it ranks in the top K (fairseq's rule: then beam_size 1 with
    alpha 0 is exactly greedy search); the best K non-EOS candidates stay alive (there are
    at least K among 2K, since each beam adds at most one EOS). A row stops when no alive
    beam, even at the largest length penalty it can still reach, could beat its best
    finished hypothesis (the one returned), or at its length limit; a row that finished nothing returns its
    best alive hypothesis (at the limit, scored with lp(limit)).
    """
    B, S = src_BS.shape
    K, T = beam_size, S + max_extra
    seg_BS, encoded_BSD, limit_B = _prepare(model, src_BS, max_extra)
    # The source is encoded once, its output repeated per beam.
    encoded_RSD, seg_RS = jnp.repeat(encoded_BSD, K, axis=0), jnp.repeat(seg_BS, K, axis=0)

    def lp(length):
        return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha

    def row_done(i, alive_logp_BK, fin_score_BK):
        # Both sets are sorted best first. Only the best hypothesis is returned, so a row is
        # done once its best finished one beats what its best alive beam could still reach.
        best_possible_B = alive_logp_BK[:, 0] / lp(limit_B)
        return (i >= limit_B) | (fin_score_BK[:, 0] > best_possible_B)

    def cond(carry):
        i, _, alive_logp_BK, _, fin_score_BK, _ = carry
        return (i < T) & ~jnp.all(row_done(i, alive_logp_BK, fin_score_BK))

    def body(carry):
        i, alive_BKT1, alive_logp_BK, fin_BKT1, fin_score_BK, cache = carry
        done_B = row_done(i, alive_logp_BK, fin_score_BK)
        logp_RV, cache = _log_probs(model, alive_BKT1.reshape(B * K, T + 1)[:, i],
                                    encoded_RSD, seg_RS, cache, i, banned_ids)
        V = logp_RV.shape[-1]
        cand_BKV = alive_logp_BK[:, :, None] + logp_RV.reshape(B, K, V)
        top_logp_BC, top_idx_BC = jax.lax.top_k(cand_BKV.reshape(B, K * V), 2 * K)
        parent_BC, tok_BC = top_idx_BC // V, (top_idx_BC % V).astype(jnp.int32)
        seq_BCT1 = _gather_beams(alive_BKT1, parent_BC).at[:, :, i + 1].set(tok_BC)
        real_BC = top_logp_BC > NEG / 2  # extensions of dead beams (or pad) stay dead
        eos_BC = tok_BC == eos_id

        to_fin_BC = eos_BC & real_BC & (jnp.arange(2 * K) < K)
        fin_cand_BC = jnp.where(to_fin_BC, top_logp_BC / lp(i + 1), NEG)
        new_fin_score_BK, idx_BK = jax.lax.top_k(
            jnp.concatenate([fin_score_BK, fin_cand_BC], axis=1), K)
        new_fin_BKT1 = _gather_beams(jnp.concatenate([fin_BKT1, seq_BCT1], axis=1), idx_BK)

        new_alive_logp_BK, idx_BK = jax.lax.top_k(
            jnp.where(eos_BC | ~real_BC, NEG, top_logp_BC), K)
        new_alive_BKT1 = _gather_beams(seq_BCT1, idx_BK)
        cache = _reorder_cache(cache, jnp.take_along_axis(parent_BC, idx_BK, axis=1))

        def keep(old, new):  # rows already done keep their state
            return jnp.where(done_B.reshape(B, *[1] * (old.ndim - 1)), old, new)
        return (i + 1, keep(alive_BKT1, new_alive_BKT1), keep(alive_logp_BK, new_alive_logp_BK),
                keep(fin_BKT1, new_fin_BKT1), keep(fin_score_BK, new_fin_score_BK), cache)

    alive_logp_BK = jnp.full((B, K), NEG, jnp.float32).at[:, 0].set(0.0)  # one live beam at first
    seq_BKT1 = jnp.zeros((B, K, T + 1), jnp.int32)
    init = (jnp.int32(0), seq_BKT1, alive_logp_BK, seq_BKT1, jnp.full((B, K), NEG, jnp.float32),
            model.init_cache(B * K, T))
    _, alive_BKT1, alive_logp_BK, fin_BKT1, fin_score_BK, _ = jax.lax.while_loop(cond, body, init)
    has_fin_B = fin_score_BK[:, 0] > NEG / 2
    ids_BT = jnp.where(has_fin_B[:, None], fin_BKT1[:, 0, 1:], alive_BKT1[:, 0, 1:])
    score_B = jnp.where(has_fin_B, fin_score_BK[:, 0], alive_logp_BK[:, 0] / lp(limit_B))
    return ids_BT, score_B


def make_translate_fn(graphdef, mesh, config: RunSpec, *, eos_id: int, beam_size: int, alpha: float,
                      max_extra: int = 50, banned_ids: tuple[int, ...] = ()):
    """jitted fn(params, src_BS) -> ids [B, S+max_extra] on `mesh`: beam_size 1 is greedy_search,
    more is beam_search; the batch split over the mesh's batch axes like training batches."""
    def translate(params, src_BS: Array) -> Array:
        model = nnx.merge(graphdef, params)
        if beam_size == 1:
            return greedy_search(model, src_BS, eos_id=eos_id, max_extra=max_extra,
                                 banned_ids=banned_ids)
        return beam_search(model, src_BS, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                           max_extra=max_extra, banned_ids=banned_ids)[0]

    if config.shard_activations:
        translate = sharding.activation_sharding(translate, mesh, config.logical_axis_rules)
    rows = sharding.batch_sharding(mesh, 2)
    # Params keep the shardings they come with (the train state's); rows split like batches.
    return jax.jit(translate, in_shardings=(None, rows), out_shardings=rows)
