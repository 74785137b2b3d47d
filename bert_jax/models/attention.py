"""Attention, in one place: who may attend to whom (`Masking`), the implementations that
compute it (`KERNELS`, chosen by `model.attention_kernel`), and the multi-head attention layer.

Every kernel receives q, k, v and a `Masking`: the packed-sequence ids of queries and keys
(0 = padding), their positions, and the flags (causal, local window, cross-attention). A dense
[B, 1, T, S] mask exists only inside the kernels that need one (`dense_mask`). A new kernel is
a function with `xla_attention`'s signature added to KERNELS; it raises `UnsupportedAttention`
for a combination it cannot compute (the message names the config field to change), and
`check` rejects such a config before anything is compiled.

Kernels: `xla` (the reference: a dense mask, runs anywhere) and `splash` (Pallas block-sparse
flash attention for TPU, in interpret mode on CPU; docs/attention.md says what it covers and
where it hands over to xla).

Shape suffixes as in layers.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from bert_jax.models.config import ModelConfig
from bert_jax.models.layers import (
    Array,
    Cache,
    constrain,
    cpu_bf16,
    dense,
    dropout,
    matmul,
    rope,
    sharding_context,
)

log = logging.getLogger(__name__)


class UnsupportedAttention(ValueError):
    """A kernel asked for a masking, dtype or option it cannot compute."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Masking:
    """Which keys each query may see. Query t of row b sees key s when both belong to the same
    packed sequence (segment id; 0 = padding), and, with `causal`, s <= q_offset + t, and, with
    `window`, |q_offset + t - s| <= window. Causal and window masks use indices (query t sits at
    q_offset + t: the cache slot it is written to), as splash and cuDNN do; within a packed
    sequence that is the order of its positions. Padding queries see every non-padding key
    the flags allow (as the reference BERT does), so no row is empty; their outputs never
    reach a loss. The positions (restarting at 0 in each packed sequence) are there for
    kernels that need them. `cross`: queries and keys are different sequences (a decoder's
    encoder-decoder attention), where a query may have no key to see."""

    q_segment_ids: Array  # [B, T] int
    kv_segment_ids: Array  # [B, S] int
    q_positions: Array  # [B, T] int
    kv_positions: Array  # [B, S] int
    q_offset: Array | int = 0  # index of the first query among the keys (incremental decoding)
    layer: Array | int = 0  # the layer attending (set by the layer stack; traced under scan)
    causal: bool = dataclasses.field(default=False, metadata={"static": True})
    window: int | None = dataclasses.field(default=None, metadata={"static": True})
    cross: bool = dataclasses.field(default=False, metadata={"static": True})
    pattern: Pattern | None = dataclasses.field(default=None, metadata={"static": True})

    def in_layer(self, layer: Array | int, num_layers: int) -> Masking:
        """This masking as layer `layer` of a stack of `num_layers` sees it."""
        if self.pattern is None:
            return self
        return dataclasses.replace(self, layer=layer,
                                   pattern=dataclasses.replace(self.pattern, num_layers=num_layers))


@dataclasses.dataclass(frozen=True)
class Pattern:
    """What varies by layer (the Masking's `layer`) or goes beyond a window: with a window,
    layer i is global (sees every key) when i % global_every == 0 (ModernBERT's convention);
    BigBird (block > 0), in blocks of `block` tokens by index: a query block sees the keys of
    the `window_blocks` blocks on each side of its own and `random_blocks` random key blocks
    (numpy's generator seeded by (layer, blocks per row): fixed for a checkpoint); and tokens
    whose position is below block * global_blocks (each packed example's first blocks, its
    [CLS] included) see, and are seen by, every token of their example."""

    num_layers: int = 1
    global_every: int = 0
    block: int = 0
    window_blocks: int = 0
    global_blocks: int = 0
    random_blocks: int = 0

    def is_global(self, layer: Array | int) -> Array | bool:
        return self.global_every > 0 and layer % self.global_every == 0

    def layer_kinds(self) -> list[int]:
        """A key per layer: layers with the same key have the same static mask."""
        if self.block:
            return list(range(self.num_layers)) if self.random_blocks else [0] * self.num_layers
        return [int(self.is_global(i)) for i in range(self.num_layers)]


def pattern_of(cfg: ModelConfig) -> tuple[int | None, Pattern | None]:
    """(the window, the Pattern) of a model config's self-attention (the stack sets its depth)."""
    window = cfg.attention_window or None
    if cfg.attention_pattern == "bigbird":
        return None, Pattern(block=cfg.bigbird_block, window_blocks=cfg.bigbird_window_blocks,
                             global_blocks=cfg.bigbird_global_blocks,
                             random_blocks=cfg.bigbird_random_blocks)
    if window is not None and cfg.attention_global_every:
        return window, Pattern(global_every=cfg.attention_global_every)
    return window, None


def bigbird_blocks(p: Pattern, layer: int, num_blocks: int) -> np.ndarray:
    """[blocks, blocks] bool: the window and random key blocks of each query block (by index;
    the global blocks come from positions). Global query blocks draw no random blocks."""
    idx = np.arange(num_blocks)
    near = np.abs(idx[:, None] - idx[None, :]) <= p.window_blocks
    rng = np.random.default_rng([layer, num_blocks])
    for i in range(p.global_blocks, num_blocks):
        choices = np.flatnonzero(~near[i] & (idx >= p.global_blocks))
        if len(choices):
            pick = rng.choice(choices, min(p.random_blocks, len(choices)), replace=False)
            near[i, pick] = True
    return near


def dense_mask(m: Masking) -> Array:
    """The boolean mask [B, 1, T, S] of a Masking: True where query t may attend to key s."""
    q = m.q_segment_ids[:, None, :, None]
    k = m.kv_segment_ids[:, None, None, :]
    mask = (k != 0) & ((q == k) | (q == 0))
    q_idx = m.q_offset + jnp.arange(m.q_segment_ids.shape[1])
    k_idx = jnp.arange(m.kv_segment_ids.shape[1])
    if m.causal:
        mask = mask & (k_idx[None, :] <= q_idx[:, None])[None, None]
    if m.window is not None:
        band = jnp.abs(q_idx[:, None] - k_idx[None, :]) <= m.window
        if m.pattern is not None:
            band = band | m.pattern.is_global(m.layer)
        mask = mask & band[None, None]
    if m.pattern is not None and m.pattern.block:
        p, S = m.pattern, m.kv_segment_ids.shape[1]
        n = -(-S // p.block)
        table = jnp.asarray(np.stack([bigbird_blocks(p, i, n) for i in range(p.num_layers)]))
        near = table[m.layer][(q_idx // p.block)[:, None], (k_idx // p.block)[None, :]]
        first = p.block * p.global_blocks
        glob = (m.q_positions < first)[:, :, None] | (m.kv_positions < first)[:, None, :]
        mask = mask & (near[None] | glob)[:, None]
    return mask


def attention_probs(q_BTNK: Array, k_BSNK: Array, mask_B1TS: Array) -> Array:
    """softmax(QK^T / sqrt(d_k)) over the keys, float32 [B, N, T, S]; masked keys get 0."""
    scale = 1.0 / math.sqrt(q_BTNK.shape[-1])
    logits_BNTS = matmul("btnk,bsnk->bnts", q_BTNK, k_BSNK).astype(jnp.float32) * scale
    logits_BNTS = jnp.where(mask_B1TS, logits_BNTS, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits_BNTS, axis=-1)


def xla_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                  dropout_rate: float = 0.0, rng: Array | None = None,
                  return_probs: bool = False) -> tuple[Array, Array | None]:
    """The reference: softmax(QK^T / sqrt(d_k)) V under the dense mask, dropout on the
    probabilities. Returns (output [B, T, N, K], the probabilities [B, N, T, S] before dropout
    when return_probs, else None). Runs anywhere XLA does."""
    mask_B1TS = dense_mask(masking)
    if (not return_probs and (rng is None or dropout_rate == 0.0)
            and not cpu_bf16(q_BTNK, k_BSNK, v_BSNK)):
        return jax.nn.dot_product_attention(q_BTNK, k_BSNK, v_BSNK, mask=mask_B1TS), None
    # Dropout on the probabilities (or returning them) needs them materialised; so does a
    # bfloat16 CPU run, whose dots go through layers.matmul.
    probs_BNTS = attention_probs(q_BTNK, k_BSNK, mask_B1TS)
    dropped_BNTS = dropout(probs_BNTS, dropout_rate, rng)
    out_BTNK = matmul("bnts,bsnk->btnk", dropped_BNTS.astype(v_BSNK.dtype), v_BSNK)
    return out_BTNK, probs_BNTS if return_probs else None


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        log.info(line)


def _splash_segment_ids(m: Masking) -> tuple[Array, Array]:
    """Splash's segment ids ([B, T], [B, S]): a query sees only keys with its id, and no query
    may be left with none (its softmax would divide by 0). Full bidirectional attention: a
    padding query joins its row's last sequence and padding keys get an id no query has (-1),
    which for an unpacked row is the reference's masking exactly (SQuAD's span softmax reads
    padding outputs); a row of padding only keeps 0 throughout. With causal or window flags a
    padding query may have no key of any sequence in reach, so padding is its own segment:
    padding outputs then differ from xla's, and no loss reads them (the decoders weight their
    targets by segment id > 0; the BERT objectives read [CLS], tags and masked positions)."""
    q, kv = m.q_segment_ids, m.kv_segment_ids
    if m.causal or m.window is not None or m.pattern is not None:
        return q, kv
    last = jnp.max(q, axis=1, keepdims=True)
    return jnp.where(q == 0, last, q), jnp.where((kv == 0) & (last > 0), -1, kv)


def _splash_mask(m: Masking, T: int, S: int, layer: int) -> splash.Mask:
    """The static [T, S] mask of the flags and layer `layer`'s pattern: splash skips the blocks
    it leaves empty. BigBird's global blocks are the row's first (by index): the positions'
    global tokens in a row holding one example from index 0 (`check_data` refuses packing)."""
    p = m.pattern
    if p is not None and p.block:
        n, first = -(-S // p.block), p.block * p.global_blocks
        near = np.kron(bigbird_blocks(p, layer, n), np.ones((p.block, p.block), bool))[:T, :S]
        near |= (np.arange(T) < first)[:, None] | (np.arange(S) < first)[None, :]
        if m.causal:
            near &= np.tri(T, S, dtype=bool)
        return splash.NumpyMask(near)
    if m.window is not None and not (p is not None and p.is_global(layer)):
        return splash.LocalMask((T, S), (m.window, 0 if m.causal else m.window), offset=0)
    return splash.CausalMask((T, S)) if m.causal else splash.FullMask((T, S))


SPLASH_MATMULS = {"forward": 2, "training": 9}  # per visited block: QK^T, PV; backward 7 more


def splash_blocks(T: int, S: int, block: int, *, causal: bool = False, window: int | None = None,
                  pattern: Pattern | None = None, layer: int = 0) -> int:
    """The [block, block] tiles splash visits in one head of one row at layer `layer`: those
    its static mask (`_splash_mask`) leaves non-empty (segment ids skip nothing statically)."""
    m = Masking(None, None, None, None, causal=causal, window=window, pattern=pattern)
    mask = _splash_mask(m, T, S, layer)
    return sum(int(mask[i:i + block, :].reshape(-1, S // block, block).any(axis=(0, 2)).sum())
               for i in range(0, T, block))


def splash_flops(cfg: ModelConfig, batch: int, length: int, *, causal: bool = False,
                 layers: int | None = None, training: bool = True) -> float:
    """Splash's matmul FLOPs for `batch` rows of `length` tokens through a stack of self-attention
    layers (default cfg.num_layers) of cfg's heads and pattern: per visited tile 2 matmuls
    forward (QK^T, PV) and, training, 7 backward (dq: QK^T, dP, dQ; dkv: QK^T, dP, dV, dK), each
    2 * block^2 * head_dim FLOPs per head. XLA's cost analysis cannot see inside the kernel."""
    layers = cfg.num_layers if layers is None else layers
    window, pattern = pattern_of(cfg)
    pattern = None if pattern is None else dataclasses.replace(pattern, num_layers=layers)
    kinds = pattern.layer_kinds() if pattern is not None else [0] * layers
    block = min(cfg.attention_block_size, length)
    visited: dict[int, int] = {}
    for i, kind in enumerate(kinds):
        if kind not in visited:
            visited[kind] = splash_blocks(length, length, block, causal=causal, window=window,
                                          pattern=pattern, layer=i)
    tiles = sum(visited[k] for k in kinds)
    per_tile = SPLASH_MATMULS["training" if training else "forward"] * 2 * block * block * cfg.head_dim
    return float(tiles * per_tile * cfg.num_heads * batch)


def _platform() -> str:
    """Where the step runs: the mesh's devices inside a sharded step (`plan` traces for a TPU
    mesh on a CPU machine), else the default backend."""
    ctx = sharding_context()
    return ctx.mesh.devices.flat[0].platform if ctx is not None else jax.default_backend()


def splash_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                     dropout_rate: float = 0.0, rng: Array | None = None,
                     return_probs: bool = False, block_size: int = 128
                     ) -> tuple[Array, Array | None]:
    """Pallas splash attention (TPU; interpret mode on CPU): flash attention over the blocks the
    flags leave non-empty, packed rows through segment ids, tiles of min(block_size, T). Inside
    a sharded step it runs per shard under shard_map (batch over the batch axes, heads over
    `tensor`). Returning probabilities, incremental decoding, cross-attention and lengths it
    cannot tile go to xla."""
    T, S = q_BTNK.shape[1], k_BSNK.shape[1]
    xla_instead = ("returning attention probabilities" if return_probs
                   else "cross-attention" if masking.cross
                   else "incremental decoding" if T != S or not isinstance(masking.q_offset, int)
                   or masking.q_offset
                   # training lengths are checked up front (check); inference may bring others
                   else f"a length of {T} (not in 128-multiple tiles)" if _bad_blocks(block_size, T)
                   else None)
    if xla_instead:
        _say_once(f"model.attention_kernel=splash: {xla_instead} runs with the xla kernel")
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=dropout_rate, rng=rng,
                             return_probs=return_probs)
    if rng is not None and dropout_rate > 0.0:
        raise UnsupportedAttention(_DROPOUT_ERROR.format(rate=dropout_rate, kernel="splash"))
    platform = _platform()
    check_platform("splash", platform)
    block = min(block_size, T)
    # Splash does not scale the logits.
    q_BTNK = q_BTNK * jnp.asarray(1.0 / math.sqrt(q_BTNK.shape[-1]), q_BTNK.dtype)
    q_seg_BT, kv_seg_BS = _splash_segment_ids(masking)

    # One kernel per distinct static mask: a layer index traced by scan_layers picks its
    # layer's kernel with lax.switch (all of them are compiled; one runs).
    layer = masking.layer
    if masking.pattern is None or isinstance(layer, int):
        layers, pick = [layer if isinstance(layer, int) else 0], jnp.int32(0)
    else:
        kinds = masking.pattern.layer_kinds()
        layers = [kinds.index(k) for k in dict.fromkeys(kinds)]  # each kind's first layer
        pick = jnp.asarray([layers.index(kinds.index(k)) for k in kinds], jnp.int32)[layer]

    def per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick):
        N = q_BTNK.shape[2]  # this shard's heads
        sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                                  block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                                  block_q_dq=block, block_kv_dq=block)
        heads_first = (lambda x: x.transpose(0, 2, 1, 3))  # [B, T, N, K] <-> [B, N, T, K]

        def run(layer):
            mask = splash.MultiHeadMask([_splash_mask(masking, T, S, layer)] * N)
            fn = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                        interpret=platform == "cpu")
            return lambda *args: jax.vmap(fn)(*args[:3], segment_ids=splash.SegmentIds(*args[3:]))

        args = (heads_first(q_BTNK), heads_first(k_BSNK), heads_first(v_BSNK), q_seg_BT, kv_seg_BS)
        if len(layers) == 1:
            return heads_first(run(layers[0])(*args))
        return heads_first(jax.lax.switch(pick, [run(i) for i in layers], *args))

    ctx = sharding_context()
    if ctx is None:
        return per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick), None
    batch, _, heads, _ = ctx.spec(("batch", "length", "heads", "kv"), q_BTNK.shape)
    spec_BTNK, spec_BT = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
    sharded = jax.shard_map(per_shard, mesh=ctx.mesh,
                            in_specs=(spec_BTNK,) * 3 + (spec_BT,) * 2 + (PartitionSpec(),),
                            out_specs=spec_BTNK, check_vma=False)
    return sharded(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick), None


def _kv_lengths(m: Masking) -> Array:
    """[B] int32: the real keys of each unpacked row (padding after them; `check_data` refuses
    packed rows). A row of padding only counts 1, so no softmax runs over nothing (its output
    differs from xla's and no loss reads it)."""
    return jnp.maximum(jnp.sum(m.kv_segment_ids != 0, axis=1), 1).astype(jnp.int32)


def dpa_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                  dropout_rate: float = 0.0, rng: Array | None = None,
                  return_probs: bool = False, implementation: str | None = "cudnn"
                  ) -> tuple[Array, Array | None]:
    """jax.nn.dot_product_attention with the masks it takes instead of a dense one: padding as
    each row's key count (key_value_seq_lengths; every query is computed, so a padding query
    sees the real keys, as in xla), `causal` as is_causal, a causal window as
    local_window_size=(W, 0), a global layer of `attention_global_every` as no window (a traced
    layer index picks with lax.cond). implementation="cudnn" is the `cudnn` kernel (cuDNN flash
    attention, GPU only); "xla" runs the same mapping anywhere (the tests' CPU check of it).
    Unpacked rows only (the masks have no segment ids). Returning probabilities and incremental
    decoding go to xla; bidirectional windows and bigbird are refused."""
    name = f"model.attention_kernel={implementation}"
    xla_instead = ("returning attention probabilities" if return_probs
                   else "incremental decoding" if not isinstance(masking.q_offset, int)
                   or masking.q_offset else None)
    if xla_instead:
        _say_once(f"{name}: {xla_instead} runs with the xla kernel")
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=dropout_rate, rng=rng,
                             return_probs=return_probs)
    if rng is not None and dropout_rate > 0.0:
        raise UnsupportedAttention(_DROPOUT_ERROR.format(rate=dropout_rate, kernel=implementation))
    if implementation == "cudnn":
        check_platform("cudnn", _platform())
    p, window = masking.pattern, masking.window
    if p is not None and p.block:
        raise UnsupportedAttention(_CUDNN_BIGBIRD)
    if window is not None and not masking.causal:
        raise UnsupportedAttention(_CUDNN_WINDOW.format(window=window))
    kv_len_B = _kv_lengths(masking)

    def run(window: int | None) -> Array:
        return jax.nn.dot_product_attention(
            q_BTNK, k_BSNK, v_BSNK, is_causal=masking.causal, key_value_seq_lengths=kv_len_B,
            local_window_size=None if window is None else (window, 0),
            implementation=implementation)

    if window is None or p is None:
        return run(window), None
    if isinstance(masking.layer, int):
        return run(None if p.is_global(masking.layer) else window), None
    return jax.lax.cond(p.is_global(masking.layer), lambda: run(None), lambda: run(window)), None


def cudnn_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, **options
                    ) -> tuple[Array, Array | None]:
    """cuDNN flash attention (GPU): `dpa_attention` with implementation="cudnn"."""
    return dpa_attention(q_BTNK, k_BSNK, v_BSNK, masking, **options, implementation="cudnn")


Kernel = Callable[..., tuple[Array, Array | None]]
KERNELS: dict[str, Kernel] = {
    "xla": xla_attention,
    "splash": splash_attention,
    "cudnn": cudnn_attention,
}
BLOCKED = ("splash",)  # the kernels that read model.attention_block_size
PLATFORMS = {"splash": ("tpu", "cpu"), "cudnn": ("gpu",)}  # where a kernel runs (default: anywhere)

_DROPOUT_ERROR = ("model.attention_dropout_rate={rate} with model.attention_kernel={kernel}: "
                  "{kernel} has no dropout on the attention probabilities; set "
                  "model.attention_dropout_rate=0 or use model.attention_kernel=xla")
_CUDNN_BIGBIRD = ("model.attention_pattern=bigbird with model.attention_kernel=cudnn: cuDNN's masks "
                  "(sequence lengths, causal, a causal window) cannot express bigbird's blocks; "
                  "choose model.attention_kernel=xla (or splash on TPU)")
_CUDNN_WINDOW = ("model.attention_window={window} with model.attention_kernel=cudnn: cuDNN's "
                 "sliding window (jax.nn.dot_product_attention) is causal only, and this "
                 "model's attention is bidirectional; choose model.attention_kernel=xla (or "
                 "splash on TPU), or model.attention_window=0")
_CUDNN_DTYPE = ("dtype={dtype} with model.attention_kernel=cudnn: cuDNN flash attention computes "
                "in bfloat16 or float16; set --config.dtype=bfloat16, or "
                "model.attention_kernel=xla")
_CUDNN_HEAD = ("model.head_dim={head_dim} with model.attention_kernel=cudnn: cuDNN flash "
               "attention needs a head dim that is a multiple of 8 and at most 256 (128 before "
               "Hopper); choose such a head_dim or model.attention_kernel=xla")
_BLOCK_ERROR = ("model.attention_kernel=splash tiles a sequence of {length} tokens in blocks of "
                "min(model.attention_block_size={block}, {length}), which must be a multiple of "
                "128 that divides {length}; choose a block size and sequence length (data."
                "max_seq_length) that are multiples of 128, or model.attention_kernel=xla")


def _bad_blocks(block_size: int, length: int) -> bool:
    block = min(block_size, length)
    return bool(block % 128 or length % block)  # splash's tiles fill whole 128-lane vregs


def kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise UnsupportedAttention(f"model.attention_kernel={name!r}; choose one of {sorted(KERNELS)}")
    return KERNELS[name]


def check_platform(name: str, platform: str) -> None:
    """An error naming the field when kernel `name` cannot run on `platform` (jax's name)."""
    if name == "splash" and platform not in PLATFORMS["splash"]:
        raise UnsupportedAttention(f"model.attention_kernel=splash runs on TPU (and on CPU in "
                                   f"interpret mode), not on {platform}; choose "
                                   f"model.attention_kernel=xla")
    if name == "cudnn" and platform not in PLATFORMS["cudnn"]:
        raise UnsupportedAttention(f"model.attention_kernel=cudnn needs a GPU (cuDNN flash "
                                   f"attention), not {platform}; choose model.attention_kernel=xla"
                                   + (" (or splash)" if platform == "tpu" else ""))


def check_pattern(cfg: ModelConfig) -> None:
    """Pattern fields that do not go together (any length); raises UnsupportedAttention."""
    p, window, every = cfg.attention_pattern, cfg.attention_window, cfg.attention_global_every
    if p != "full" and window:
        raise UnsupportedAttention(
            f"model.attention_window={window} with model.attention_pattern={p}: the window is the "
            f"local pattern of model.attention_pattern=full"
            + ("; bigbird's window is model.bigbird_window_blocks" if p == "bigbird" else "")
            + "; set model.attention_window=0")
    if every and not window:
        raise UnsupportedAttention(
            f"model.attention_global_every={every} makes every {every}th layer global among local "
            f"layers: it needs model.attention_window > 0 (e.g. 128), or set it to 0")
    if p == "linformer" and not hasattr(cfg, "linformer_k"):
        raise UnsupportedAttention(
            f"model.attention_pattern=linformer: {type(cfg).family} models attend causally or "
            f"across sequences; linformer (keys projected along the sequence) is for the BERT "
            f"models; choose model.attention_pattern=full or bigbird")
    if p == "linformer" and cfg.attention_kernel != "xla":
        raise UnsupportedAttention(
            "model.attention_pattern=linformer runs with model.attention_kernel=xla (its keys "
            "are linformer_k projections, no sparse mask); set model.attention_kernel=xla")


def check_data(cfg: ModelConfig, *, packed: bool) -> None:
    """What the pattern cannot do with packed rows (data.pack)."""
    if packed and cfg.attention_pattern == "linformer":
        raise UnsupportedAttention(
            "model.attention_pattern=linformer with data.pack=True: linformer's projection mixes "
            "every position of a row, so packed examples would see each other; set "
            "data.pack=False or choose another model.attention_pattern")
    if cfg.attention_kernel == "cudnn" and (packed or type(cfg).family != "BERT"):
        rows = ("data.pack=True" if packed else
                f"the {type(cfg).family} models' batches (packed rows with segment ids)")
        raise UnsupportedAttention(
            f"model.attention_kernel=cudnn with {rows}: cuDNN's masks (sequence lengths) cannot "
            f"keep the sequences of a packed row apart; "
            + ("set data.pack=False or " if packed else "")
            + "choose model.attention_kernel=xla (or splash on TPU)")
    if packed and cfg.attention_pattern == "bigbird" and cfg.attention_kernel == "splash":
        raise UnsupportedAttention(
            "model.attention_pattern=bigbird with model.attention_kernel=splash and data.pack=True: "
            "splash's static mask makes only each row's first blocks global, not each packed "
            "example's; set data.pack=False or model.attention_kernel=xla")


def _check_cudnn(cfg: ModelConfig, *, training: bool) -> None:
    """What the cudnn kernel cannot compute (any length)."""
    if training and cfg.attention_dropout_rate > 0.0:
        raise UnsupportedAttention(_DROPOUT_ERROR.format(rate=cfg.attention_dropout_rate,
                                                         kernel="cudnn"))
    if cfg.attention_pattern == "bigbird":
        raise UnsupportedAttention(_CUDNN_BIGBIRD)
    if cfg.attention_window and type(cfg).family != "decoder-only":  # bidirectional somewhere
        raise UnsupportedAttention(_CUDNN_WINDOW.format(window=cfg.attention_window))
    if cfg.dtype not in ("bfloat16", "float16"):
        raise UnsupportedAttention(_CUDNN_DTYPE.format(dtype=cfg.dtype))
    if cfg.head_dim % 8 or cfg.head_dim > 256:
        raise UnsupportedAttention(_CUDNN_HEAD.format(head_dim=cfg.head_dim))


def _divisor(length: int, block: int) -> int:
    """The largest divisor of length below it and not above block (a suggestion)."""
    return max(d for d in range(1, max(2, min(block, length // 2) + 1)) if length % d == 0)


def check(cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
    """What the attention settings cannot do at these sequence lengths (training: with the
    config's dropout), found before anything is compiled; raises UnsupportedAttention."""
    kernel(cfg.attention_kernel)
    check_pattern(cfg)
    for length in lengths:
        if cfg.attention_window >= length:
            raise UnsupportedAttention(
                f"model.attention_window={cfg.attention_window} is not smaller than the sequence "
                f"length {length}: every token would see every other; choose a window below "
                f"{length}, or model.attention_window=0 (full attention)")
        if cfg.attention_pattern == "bigbird" and length % cfg.bigbird_block:
            raise UnsupportedAttention(
                f"model.bigbird_block={cfg.bigbird_block} does not divide the sequence length "
                f"{length}: bigbird works in whole blocks; choose a block that divides {length} "
                f"(e.g. model.bigbird_block={_divisor(length, cfg.bigbird_block)})")
        if cfg.attention_pattern == "linformer" and cfg.linformer_k >= length:
            raise UnsupportedAttention(
                f"model.linformer_k={cfg.linformer_k} is not smaller than the sequence length "
                f"{length}: the projection would not shorten it; choose model.linformer_k below "
                f"{length}, or model.attention_pattern=full")
    if cfg.attention_kernel == "cudnn":
        _check_cudnn(cfg, training=training)
    if cfg.attention_kernel != "splash":
        return
    if training and cfg.attention_dropout_rate > 0.0:
        raise UnsupportedAttention(_DROPOUT_ERROR.format(rate=cfg.attention_dropout_rate,
                                                         kernel="splash"))
    for length in lengths:
        if _bad_blocks(cfg.attention_block_size, length):
            raise UnsupportedAttention(_BLOCK_ERROR.format(block=cfg.attention_block_size,
                                                           length=length))


def rope_theta(m: Masking, global_theta: float, local_theta: float) -> Array | float:
    """The rope base of the layer attending: the local one where a window applies (all layers,
    or those a Pattern does not make global), else the global one."""
    if m.window is None:
        return global_theta
    if m.pattern is None or not m.pattern.global_every:
        return local_theta
    return jnp.where(m.pattern.is_global(m.layer), global_theta, local_theta)


class Attention(nnx.Module):
    """Multi-head attention (self or encoder-decoder) with an optional key/value cache."""

    def __init__(self, cfg, *, rngs: nnx.Rngs, cross: bool = False):
        D, N, K = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        self.query = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.key = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.value = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.out = dense(cfg, (N, K), D, ("heads", "kv", "embed"), axis=(-2, -1), rngs=rngs)
        self.dropout_rate = cfg.attention_dropout_rate
        # Rotary positions on self-attention's queries and keys; the local (window) layers
        # have their own base (ModernBERT: 10k local, 160k global).
        self.rope = cfg.positions == "rope" and not cross
        self.rope_thetas = (cfg.rope_theta, cfg.rope_local_theta or cfg.rope_theta)
        self.kernel = cfg.attention_kernel
        kernel(self.kernel)  # an unknown name fails here, when the model is built
        self.options = {"block_size": cfg.attention_block_size} if self.kernel in BLOCKED else {}
        # Linformer: one [max_len, k] projection per layer, shared by keys, values and heads
        # (the paper's key-value sharing).
        self.linformer = (nnx.Param(nnx.initializers.normal(cfg.max_len ** -0.5)(
            rngs.params(), (cfg.max_len, cfg.linformer_k)), out_sharding=(None, None))
            if cfg.attention_pattern == "linformer" else None)

    def _project(self, k_BSNK: Array, v_BSNK: Array, m: Masking) -> tuple[Array, Array, Masking]:
        """Linformer: keys and values projected along the sequence to k; padding keys are zeroed
        first, so a row's output depends on its real tokens only. Every query sees all k."""
        S = k_BSNK.shape[1]
        E_SJ = self.linformer[...][:S].astype(k_BSNK.dtype)
        real = (m.kv_segment_ids != 0)[:, :, None, None]
        k_BJNK, v_BJNK = (matmul("bsnk,sj->bjnk", jnp.where(real, x, 0), E_SJ)
                          for x in (k_BSNK, v_BSNK))
        B, J = k_BJNK.shape[:2]
        kv_pos_BJ = jnp.broadcast_to(jnp.arange(J), (B, J))
        return k_BJNK, v_BJNK, Masking((m.q_segment_ids != 0).astype(jnp.int32),
                                       jnp.ones((B, J), jnp.int32), m.q_positions, kv_pos_BJ)

    def __call__(self, x_BTD: Array, kv_BSD: Array, masking: Masking, *, rng: Array | None = None,
                 cache: Cache | None = None, cache_index: Array | None = None,
                 return_probs: bool = False) -> tuple[Array, Cache | None, Array | None]:
        """Returns (output [B, T, D], the updated cache, the probabilities [B, N, T, S] when
        return_probs else None). With `cache`, this step's keys and values are written at
        cache_index and the queries attend over every cache slot (masking hides the slots
        not written yet)."""
        heads = ("batch", "length", "heads", "kv")
        q_BTNK = constrain(self.query(x_BTD), *heads)
        k_BSNK, v_BSNK = constrain(self.key(kv_BSD), *heads), constrain(self.value(kv_BSD), *heads)
        if self.rope:  # self-attention: the new keys sit at the queries' positions
            theta = rope_theta(masking, *self.rope_thetas)
            q_BTNK = rope(q_BTNK, masking.q_positions, theta)
            k_BSNK = rope(k_BSNK, masking.q_positions, theta)
        if cache is not None:
            start = (0, cache_index, 0, 0)
            k_BSNK = jax.lax.dynamic_update_slice(cache["key"], k_BSNK.astype(cache["key"].dtype), start)
            v_BSNK = jax.lax.dynamic_update_slice(cache["value"], v_BSNK.astype(cache["value"].dtype), start)
            cache = {"key": k_BSNK, "value": v_BSNK}
        if self.linformer is not None:
            k_BSNK, v_BSNK, masking = self._project(k_BSNK, v_BSNK, masking)
        out_BTNK, probs_BNTS = kernel(self.kernel)(q_BTNK, k_BSNK, v_BSNK, masking,
                                                   dropout_rate=self.dropout_rate, rng=rng,
                                                   return_probs=return_probs, **self.options)
        return self.out(constrain(out_BTNK, *heads)), cache, probs_BNTS
