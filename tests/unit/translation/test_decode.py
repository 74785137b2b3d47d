"""Greedy and beam search: beam 1 is greedy, beam search finds the brute-force best, the
cache changes nothing, and the jitted fn on a sharded mesh (scanned layers) agrees."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.training import sharding, state
from bert_jax.training.objectives import shift_right
from bert_jax.translation import decode

EOS = 5  # the small model ends some rows with it, early or late, and runs others to the limit
MAX_EXTRA = 6
LENGTHS = [6, 5, 4, 3, 2, 1, 6, 0]  # source lengths; the last row is a padding example
TOY_EXTRA = 2


def fields(vocab_size: int, **kw) -> dict:
    f = models.transformer_model_fields("base", vocab_size=vocab_size)
    # An untied output layer: random tied models mostly repeat their input token.
    f.update({**dict(vocab_size=vocab_size, emb_dim=32, num_layers=2, num_decoder_layers=2,
                     num_heads=4, head_dim=8, mlp_dim=48, max_len=40, tie_output=False), **kw})
    return models.model_section("transformer", f)


def sources(vocab_size: int, lengths: list[int], seed: int = 1) -> jax.Array:
    ids = np.random.RandomState(seed).randint(1, vocab_size, (len(lengths), max(lengths)))
    return jnp.asarray(ids * (np.arange(max(lengths)) < np.array(lengths)[:, None]))


@pytest.fixture(scope="module")
def small():
    return models.create_model(fields(11), seed=1)


@pytest.fixture(scope="module")
def src():
    return sources(11, LENGTHS)


def lp(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


def full_logits(model, src_BS, tgt_BT) -> jax.Array:
    """Teacher-forced logits of a full forward pass (no cache); every target slot is real, so
    the BOS slot (id 0) is a query and key like any other."""
    ones_BT = jnp.ones_like(tgt_BT)
    return model(src_BS, shift_right(tgt_BT, ones_BT), tgt_segments_BT=ones_BT)


forward = nnx.jit(full_logits)
# alpha and eos_id traced: one compile serves every alpha and EOS id below, and each
# (model, beam size) compiles once for the module (the tests below share them).
beam = nnx.jit(decode.beam_search, static_argnames=("beam_size", "max_extra"))
greedy = nnx.jit(decode.greedy_search, static_argnames=("max_extra",))


def test_beam_of_one_is_greedy(small, src):
    ids = np.asarray(greedy(small, src, eos_id=EOS, max_extra=MAX_EXTRA))
    beam_ids, scores = beam(small, src, eos_id=EOS, beam_size=1, alpha=0.0, max_extra=MAX_EXTRA)
    np.testing.assert_array_equal(beam_ids, ids)
    assert ids.shape == (8, 6 + MAX_EXTRA) and ids.dtype == np.int32
    ended = (ids == EOS).any(axis=1)
    assert ended.any() and not ended[:-1].all()  # both ways of stopping happen
    assert not ids[-1].any() and scores[-1] == 0  # the padding row
    for row, n in zip(ids, LENGTHS, strict=True):
        stop = np.flatnonzero(row == EOS)[0] + 1 if (row == EOS).any() else n + MAX_EXTRA * (n > 0)
        assert (row[:stop] > 0).all() and not row[stop:].any()  # EOS or the limit, 0 after


def test_cache_changes_nothing(small, src):
    """Greedy search by full forward passes over the growing prefix (no cache), and the
    cached path's logits at every step against the full pass."""
    B, T = src.shape[0], src.shape[1] + MAX_EXTRA
    full = jax.jit(lambda tgt: full_logits(small, src, tgt))
    limits = [n + MAX_EXTRA if n else 0 for n in LENGTHS]
    tgt, done = np.zeros((B, T), np.int32), np.array([n == 0 for n in limits])
    for t in range(T):
        logits = np.asarray(full(jnp.asarray(tgt)))[:, t]
        tok = np.where(done, 0, np.argmax(logits[:, 1:], axis=-1) + 1)  # pad is never generated
        tgt[:, t] = tok
        done |= (tok == EOS) | (t + 1 >= np.array(limits))
    np.testing.assert_array_equal(greedy(small, src, eos_id=EOS, max_extra=MAX_EXTRA), tgt)

    # jitted, as the search runs it (eagerly, each of its operations is a compile of its own)
    encoded = jax.jit(lambda s: small.encode(s, src_segments_BS=(s != 0).astype(jnp.int32)))(src)
    step = jax.jit(lambda tok, cache, i: small.decode(tok, encoded, (src != 0).astype(jnp.int32),
                                                      cache=cache, cache_index=i))
    cache, tgt_in, cached = small.init_cache(B, T), shift_right(tgt, np.ones_like(tgt)), []
    for i in range(T):
        logits, cache = step(tgt_in[:, i:i + 1], cache, jnp.int32(i))
        cached.append(logits)
    np.testing.assert_allclose(jnp.concatenate(cached, axis=1), full(jnp.asarray(tgt)),
                               atol=1e-5, rtol=1e-5)


def brute_force(model, src_1S, limit: int, eos_id: int | None, alpha: float, real: list[int]):
    """(best ids, score) over every output: real tokens then EOS within `limit` tokens, or
    `limit` real tokens when there is no EOS (eos_id None: no hypothesis ever finishes)."""
    if eos_id is None:
        cands = [list(w) for w in itertools.product(real, repeat=limit)]
    else:
        cands = [[*w, eos_id] for n in range(limit) for w in itertools.product(real, repeat=n)]
    tgt = np.zeros((256, src_1S.shape[1] + TOY_EXTRA), np.int32)  # one shape: one compile
    for k, c in enumerate(cands):
        tgt[k, :len(c)] = c
    logp = jax.nn.log_softmax(forward(model, jnp.repeat(src_1S, len(tgt), 0), jnp.asarray(tgt)))
    token_logp = np.take_along_axis(np.asarray(logp), tgt[:, :, None], axis=-1)[:, :, 0]
    scores = [token_logp[k, :len(c)].sum() / lp(len(c), alpha) for k, c in enumerate(cands)]
    best = int(np.argmax(scores))
    return cands[best], scores[best]


@pytest.mark.parametrize("seed", [0, 3])
def test_beam_search_finds_the_best_sequence(seed):
    """Vocabulary {0 pad, 1, 2, 3 EOS, 4}, outputs of at most 4 tokens: a beam of 110 holds
    every hypothesis (and ranks every candidate of a step in its top beam_size), so it must
    return the best of all of them by score. A large init scale makes the model confident
    enough that the best outputs are of several lengths."""
    model = models.create_model(fields(5, num_layers=1, num_decoder_layers=1,
                                       initializer="truncated_normal", initializer_range=1.0),
                                seed=seed)
    src = jnp.asarray([[1, 0], [2, 4], [4, 1], [0, 0]])
    limits, lengths, beaten = [3, 4, 4, 0], set(), 0
    # eos_id 99 is never produced: every row runs to its limit and returns its best alive beam.
    for alpha, eos_id in [(0.0, 3), (0.6, 3), (2.0, 3), (0.6, 99)]:
        real = [1, 2, 4] if eos_id == 3 else [1, 2, 3, 4]
        ids, scores = beam(model, src, eos_id=eos_id, beam_size=110, alpha=alpha,
                           max_extra=TOY_EXTRA)
        for b, limit in enumerate(limits[:-1]):
            best, score = brute_force(model, src[b:b + 1], limit, eos_id if eos_id == 3 else None,
                                      alpha, real)
            np.testing.assert_array_equal(ids[b], best + [0] * (4 - len(best)))
            np.testing.assert_allclose(scores[b], score, rtol=1e-5)
            lengths.add(len(best))
        assert not ids[-1].any() and scores[-1] == 0  # the padding row
        beaten += (ids != greedy(model, src, eos_id=eos_id, max_extra=TOY_EXTRA)).any()
    assert beaten and len(lengths) >= 3  # not a problem greedy search, or stopping at once, solves


def reference_beam_search(model, src_1S, limit: int, eos_id: int, beam_size: int,
                          alpha: float) -> tuple[list[int], float]:
    """The same search spelled out: full forward passes (no cache), every step to the limit
    (no early stop), every finished hypothesis kept; the best finished, else the best alive."""
    T, K = src_1S.shape[1] + MAX_EXTRA, beam_size
    alive, finished = [([], 0.0)], []
    for t in range(limit):
        tgt = np.zeros((K, T), np.int32)
        for k, (seq, _) in enumerate(alive):
            tgt[k, :t] = seq
        logp = np.asarray(jax.nn.log_softmax(forward(model, jnp.repeat(src_1S, K, 0), tgt)))
        cands = [(seq + [v], score + logp[k, t, v]) for k, (seq, score) in enumerate(alive)
                 for v in range(1, logp.shape[-1])]  # pad is never generated
        top = sorted(cands, key=lambda c: -c[1])[:2 * K]
        finished += [(seq, score / lp(t + 1, alpha)) for rank, (seq, score) in enumerate(top)
                     if seq[-1] == eos_id and rank < K]
        alive = [c for c in top if c[0][-1] != eos_id][:K]
    if finished:
        return max(finished, key=lambda c: c[1])
    return alive[0][0], alive[0][1] / lp(limit, alpha)


# The last case: with one beam and a strong length penalty, an early stop judged at the
# current length (not the longest the row can reach) would return a worse hypothesis.
@pytest.mark.parametrize("beam_size, alpha, eos_id", [(3, 0.6, EOS), (3, 2.0, EOS), (1, 3.0, 6)])
def test_beam_search_equals_the_reference(small, src, beam_size, alpha, eos_id):
    """A narrow beam on a real-sized problem: same hypotheses and scores as the reference,
    so the cache reordering and the early stop (which must never cut a better hypothesis
    off) change nothing."""
    ids, scores = beam(small, src, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                       max_extra=MAX_EXTRA)
    for b, n in enumerate(LENGTHS[:-1]):
        best, score = reference_beam_search(small, src[b:b + 1], n + MAX_EXTRA, eos_id,
                                            beam_size, alpha)
        np.testing.assert_array_equal(ids[b], best + [0] * (ids.shape[1] - len(best)))
        np.testing.assert_allclose(scores[b], score, rtol=1e-5)


@pytest.mark.parametrize("beam_size, mesh_shape", [(1, {}), (3, dict(data=2, fsdp=2, tensor=2))])
def test_translate_fn_on_a_mesh_with_scanned_layers(small, src, beam_size, mesh_shape):
    config = config_lib.training_defaults()
    config.model = fields(11, scan_layers=True)
    config.mesh.update(mesh_shape)
    mesh = sharding.make_mesh(config.mesh)
    graphdef, _, shardings = state.abstract_state(config, mesh)
    params = jax.device_put(nnx.to_pure_dict(nnx.state(small, nnx.Param)), shardings["params"])
    translate = decode.make_translate_fn(graphdef, mesh, config, eos_id=EOS, beam_size=beam_size,
                                         alpha=0.6, max_extra=MAX_EXTRA)
    ids = translate(params, src)
    assert ids.sharding.is_equivalent_to(sharding.batch_sharding(mesh, 2), 2)
    if beam_size == 1:
        expected = greedy(small, src, eos_id=EOS, max_extra=MAX_EXTRA)
    else:
        expected = beam(small, src, eos_id=EOS, beam_size=beam_size, alpha=0.6,
                        max_extra=MAX_EXTRA)[0]
    np.testing.assert_array_equal(ids, expected)
