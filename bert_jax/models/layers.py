"""Building blocks: dense/embedding/LayerNorm layers, dropout, positions, bfloat16 matmuls on
CPU, activation sharding constraints, FLOPs per token. The model configs are in config.py,
who attends to whom in masking.py, the attention kernels in kernels/, the attention layer in
attention.py, the layer stack in transformer.py.

Shape suffixes used in all model code: B batch, T query length, S key length,
D model width (emb_dim), N heads, K head dim, F feed-forward width (mlp_dim),
V vocabulary, L layers, P predicted positions, C choices.

Parameters carry logical axis names (t5x vocabulary: embed, mlp, heads, kv, vocab,
layers); `sharding.py` maps them onto mesh axes. No physical mesh axis appears here.
Dropout is functional: every call takes `rng` (a PRNG key) and is deterministic when
`rng is None`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models.config import ModelConfig
from bert_jax.models.masking import attention_keys

Array = jax.Array
Cache = dict[str, Array]

# Activation sharding: while a `sharding.activation_sharding` context is active (set around
# the train and eval steps), `constrain(x, axes)` pins an activation's layout by logical axis
# names (batch, length, embed, heads, kv, mlp, vocab), and a kernel that runs per shard
# (kernels/splash.py) asks `sharding_context()` for the mesh and the PartitionSpec of its
# operands; elsewhere constrain does nothing and such kernels run unsharded.


@dataclasses.dataclass(frozen=True)
class ShardingContext:
    """The mesh of a sharded step and `spec(axes, shape)`: the PartitionSpec of an array with
    logical `axes` (the config's logical_axis_rules)."""

    mesh: jax.sharding.Mesh
    spec: Callable[[tuple[str, ...], tuple[int, ...]], jax.sharding.PartitionSpec]


_SHARDING: contextvars.ContextVar[ShardingContext | None] = contextvars.ContextVar(
    "sharding", default=None)


@contextlib.contextmanager
def sharded(context: ShardingContext):
    token = _SHARDING.set(context)
    try:
        yield
    finally:
        _SHARDING.reset(token)


def sharding_context() -> ShardingContext | None:
    return _SHARDING.get()


def constrain(x: Array, *axes: str) -> Array:
    ctx = _SHARDING.get()
    if ctx is None:
        return x
    return jax.lax.with_sharding_constraint(
        x, jax.sharding.NamedSharding(ctx.mesh, ctx.spec(axes, x.shape)))


# XLA on CPU runs a bfloat16 x bfloat16 dot natively (AVX512-BF16/AMX through its YNNPACK
# fusions) only when the dot accumulates into float32 (preferred_element_type); a dot with a
# bfloat16 result is computed as convert-to-f32, f32 dot, convert back: slower than float32.
# So on CPU the bfloat16 matmuls are spelled as f32-accumulating dots rounded back to bfloat16,
# the same arithmetic as TPU/GPU bfloat16 dots, with a custom VJP that keeps the backward dots
# in that form too (autodiff would make them f32 x bf16). Float32 matmuls on CPU take the same
# custom VJP: autodiff's weight gradient comes out as a dot contracting the left operand's
# first axis, which XLA:CPU runs as a plain dot thunk outside its YNNPACK fusions, where the
# written-out backward (each gradient one einsum, the activations on the left) gets them: the
# mini ModernBERT train step takes 16% less CPU at 128 tokens and 12% at 1,024
# (benchmarks/modernbert_profile.py). Every other backend runs the plain jnp.einsum /
# lax.dot_general.


def cpu_bf16(*xs: Array) -> bool:
    return all(x.dtype == jnp.bfloat16 for x in xs) and jax.default_backend() == "cpu"


def cpu_matmul(*xs: Array) -> bool:
    """Whether `matmul` takes the custom VJP below: on CPU, operands all bfloat16 or all float32."""
    return (jax.default_backend() == "cpu" and len({x.dtype for x in xs}) == 1
            and xs[0].dtype in (jnp.bfloat16, jnp.float32))


def _einsum_f32acc(spec: str, a: Array, b: Array) -> Array:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _ordered(s1: str, s2: str, out: str, x1: Array, x2: Array) -> Array:
    """einsum s1,s2->out with, as the left operand, the one whose leading axes are the batch
    axes: XLA CPU (jax 0.10) rejects some other bf16 x bf16 -> f32 orders at run time
    ("Unsupported element type for DotThunk::Execute")."""
    batch = [c for c in s1 if c in s2 and c in out]
    n = len(batch)
    if n and sorted(s2[:n]) == sorted(batch) and sorted(s1[:n]) != sorted(batch):
        s1, s2, x1, x2 = s2, s1, x2, x1
    return _einsum_f32acc(f"{s1},{s2}->{out}", x1, x2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bf16_einsum(spec: str, a: Array, b: Array) -> Array:
    return _einsum_f32acc(spec, a, b).astype(a.dtype)


def _bf16_einsum_fwd(spec, a, b):
    return _bf16_einsum(spec, a, b), (a, b)


def _bf16_einsum_bwd(spec, res, g):
    a, b = res
    (sa, sb), so = spec.split("->")[0].split(","), spec.split("->")[1]
    g = g.astype(a.dtype)
    return (_ordered(so, sb, sa, g, b).astype(a.dtype), _ordered(sa, so, sb, a, g).astype(b.dtype))


_bf16_einsum.defvjp(_bf16_einsum_fwd, _bf16_einsum_bwd)


def matmul(spec: str, a: Array, b: Array) -> Array:
    """jnp.einsum of two operands (two-operand spec, no ellipsis, no repeated or summed-only
    axes); on CPU (bfloat16 or float32) through the custom VJP above."""
    return _bf16_einsum(spec, a, b) if cpu_matmul(a, b) else jnp.einsum(spec, a, b)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                 out_sharding=None):
    """lax.dot_general for nnx.LinearGeneral(dot_general=...), through `matmul` on CPU."""
    if not cpu_matmul(lhs, rhs) or precision is not None or preferred_element_type is not None \
            or out_sharding is not None:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type,
                                   out_sharding=out_sharding)
    (lc, rc), (lb, rb) = dimension_numbers
    sl = list(_LETTERS[:lhs.ndim])
    sr = [None] * rhs.ndim
    for i, j in (*zip(lc, rc), *zip(lb, rb)):
        sr[j] = sl[i]
    fresh = iter(_LETTERS[lhs.ndim:])
    sr = [c if c is not None else next(fresh) for c in sr]
    so = ([sl[i] for i in lb] + [c for i, c in enumerate(sl) if i not in lc and i not in lb]
          + [c for j, c in enumerate(sr) if j not in rc and j not in rb])
    return matmul(f"{''.join(sl)},{''.join(sr)}->{''.join(so)}", lhs, rhs)


def attend(table: nnx.Embed, x: Array) -> Array:
    """table.attend(x) (logits against the embedding table), through `matmul` on CPU."""
    if table.dtype not in (jnp.bfloat16, jnp.float32) or jax.default_backend() != "cpu":
        return table.attend(x)
    x, emb = table.promote_dtype((x, table.embedding[...]), dtype=table.dtype, inexact=True)
    return matmul(f"{_LETTERS[:x.ndim - 1]}z,yz->{_LETTERS[:x.ndim - 1]}y", x, emb)


# A kernel's role, for full_megatron: "in" (q/k/v, the MLP's input, the MLM head's dense),
# "out" (what adds to the residual stream: attention's and the MLP's output projections; the
# task heads' dense, ModernBERT's FlexBertPoolingHead), "final_out" (the classifiers).
ROLES = ("in", "out", "final_out")


def kernel_init(cfg: ModelConfig, role: str = "in") -> nnx.Initializer:
    if cfg.initializer == "full_megatron":
        # ModernBERT's init_method full_megatron (its bert_layers/initialization.py, as metaseq
        # and OLMo): truncated normal at init_cutoff_factor 2 stddev, the stddev by role.
        std = {"in": cfg.initializer_range,
               "out": cfg.initializer_range / math.sqrt(2.0 * cfg.num_layers),
               "final_out": cfg.emb_dim**-0.5}[role]
        return nnx.initializers.truncated_normal(std)
    if cfg.initializer == "truncated_normal":
        # BERT's truncated_normal(stddev) truncates at 2 stddev (of the untruncated normal).
        return nnx.initializers.truncated_normal(cfg.initializer_range)
    return nnx.initializers.xavier_uniform()


def embed_init(cfg: ModelConfig) -> nnx.Initializer:
    if cfg.initializer in ("truncated_normal", "full_megatron"):
        return nnx.initializers.truncated_normal(cfg.initializer_range)
    # Scaled by sqrt(d) at lookup (paper 3.4), so unit-variance rows end up ~N(0, d).
    return nnx.initializers.normal(cfg.emb_dim**-0.5)


def dense(cfg: ModelConfig, in_features, out_features, axes: tuple, *, rngs: nnx.Rngs,
          axis=-1, use_bias: bool | None = None, role: str = "in") -> nnx.LinearGeneral:
    """A LinearGeneral whose kernel and bias carry logical axis names; with a bias when
    `use_bias`, by default the config's (the model's inner layers; the task classifiers always
    have one); its kernel initialised for its `role` (ROLES)."""
    n_out = 1 if isinstance(out_features, int) else len(out_features)
    return nnx.LinearGeneral(
        in_features, out_features, axis=axis, use_bias=cfg.use_bias if use_bias is None else use_bias,
        dtype=cfg.compute_dtype, kernel_init=kernel_init(cfg, role), rngs=rngs,
        dot_general=_dot_general,
        kernel_metadata={"out_sharding": axes},
        bias_metadata={"out_sharding": axes[-n_out:]},
    )


def layer_norm(cfg: ModelConfig, *, rngs: nnx.Rngs) -> nnx.LayerNorm | nnx.RMSNorm:
    """The config's normalization over emb_dim: LayerNorm (with or without bias) or RMSNorm."""
    if cfg.normalization == "rmsnorm":
        return nnx.RMSNorm(cfg.emb_dim, epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                           use_fast_variance=False, rngs=rngs,
                           scale_metadata={"out_sharding": ("embed",)})
    # use_fast_variance=False: E[(x-mu)^2], the reference formula (E[x^2]-mu^2 loses digits).
    return nnx.LayerNorm(
        cfg.emb_dim, epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
        use_fast_variance=False, use_bias=cfg.norm_bias, rngs=rngs,
        scale_metadata={"out_sharding": ("embed",)}, bias_metadata={"out_sharding": ("embed",)},
    )


def embed(cfg: ModelConfig, num: int, axes: tuple, *, rngs: nnx.Rngs) -> nnx.Embed:
    return nnx.Embed(num, cfg.emb_dim, dtype=cfg.compute_dtype, embedding_init=embed_init(cfg),
                     embedding_metadata={"out_sharding": axes}, rngs=rngs)


def dropout(x: Array, rate: float, rng: Array | None) -> Array:
    """Inverted dropout; identity when rng is None (deterministic) or rate is 0.

    Each random 32-bit word decides two elements (16 bits each: the rate is rounded to a
    multiple of 1/65536), halving the random bits, which cost ~10% of a BERT step on CPU."""
    if rng is None or rate == 0.0:
        return x
    drop = round(rate * 65536)  # elements whose 16 random bits are below this are dropped
    if drop >= 65536:
        raise ValueError(f"dropout rate {rate} rounds to 1 (16-bit draws); use a rate below 0.99998")
    words = jax.random.bits(rng, ((x.size + 1) // 2,), jnp.uint32)
    halves = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:x.size]
    keep = halves.reshape(x.shape) >= drop
    return jnp.where(keep, x / (1.0 - drop / 65536), 0).astype(x.dtype)


def split_rng(rng: Array | None, n: int) -> list[Array | None]:
    """n independent keys from rng, or n Nones (deterministic) when rng is None."""
    return [None] * n if rng is None else list(jax.random.split(rng, n))


def layer_flops_per_token(cfg: ModelConfig, seq_len: int, *, cross_attention: bool = False) -> float:
    """Forward matmul FLOPs per token of one Block at key length seq_len (2 per multiply-add):
    Q/K/V/output projections, QK^T and AV (2 * 2 * keys * heads * head_dim, keys from
    `masking.attention_keys`; linformer adds its projection of keys and values, 2 * 2 * k * heads *
    head_dim), the FFN. (Cross-attention sees every key.)"""
    nk = cfg.num_heads * cfg.head_dim
    keys = attention_keys(cfg, seq_len)
    projections = 2 * 4 * cfg.emb_dim * nk
    attention = projections + 2 * 2 * keys * nk
    if cfg.attention_pattern == "linformer":
        attention += 2 * 2 * keys * nk
    if cross_attention:
        attention += projections + 2 * 2 * seq_len * nk
    ffn_matrices = 3 if cfg.mlp_layer == "glu" else 2
    return attention + 2 * ffn_matrices * cfg.emb_dim * cfg.mlp_dim


def logits_flops_per_token(cfg: ModelConfig) -> int:
    """The vocabulary projection's forward FLOPs per token."""
    return 2 * cfg.emb_dim * cfg.vocab_rows


ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}


def add_positions(x_BTD: Array, positions_BT: Array, table: nnx.Embed | None,
                  sinusoidal: bool) -> Array:
    """x plus its position embeddings: the learned `table`'s rows, or the sinusoidal encoding,
    or nothing (rope: the attention applies it)."""
    if table is not None:
        return x_BTD + table(positions_BT)
    if sinusoidal:
        return x_BTD + sinusoidal_positions(positions_BT, x_BTD.shape[-1]).astype(x_BTD.dtype)
    return x_BTD


def sinusoidal_positions(positions: Array, dim: int) -> Array:
    """Paper 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same)."""
    inv_freq = 10000.0 ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = positions[..., None].astype(jnp.float32) * inv_freq
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # interleave sin, cos
    return table.reshape(*positions.shape, -1)[..., :dim]


def rope(x_BTNK: Array, positions_BT: Array, theta: Array | float) -> Array:
    """Rotary position embedding (Su et al. 2021) in the rotate-half layout of GPT-NeoX and
    Hugging Face: dimension i < K/2 pairs with i + K/2, rotated by position / theta^(2i/K);
    computed in float32, returned in x's dtype. `theta` may be traced (chosen per layer)."""
    K = x_BTNK.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K))
    angles_BTH = positions_BT[..., None].astype(jnp.float32) * inv_freq
    cos, sin = jnp.cos(angles_BTH)[:, :, None, :], jnp.sin(angles_BTH)[:, :, None, :]
    x = x_BTNK.astype(jnp.float32)
    x1, x2 = x[..., :K // 2], x[..., K // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BTNK.dtype)
