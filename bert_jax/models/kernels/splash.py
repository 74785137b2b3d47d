"""The splash kernel: Pallas block-sparse flash attention for TPU (interpret mode on CPU), with
packed rows through segment ids and the static masks of windows, global layers and BigBird;
its refusals (dropout, lengths not in 128-multiple tiles, BigBird with packed rows) and its
FLOPs from the tiles it visits (XLA's cost analysis cannot see inside it). docs/attention.md
says what it covers and where it hands over to xla. Shape suffixes as in layers.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from bert_jax import chips
from bert_jax.models.config import ModelConfig
from bert_jax.models.kernels import (
    Array,
    Kernel,
    UnsupportedAttention,
    platform,
    refuse_dropout,
    register,
    say_once,
)
from bert_jax.models.kernels.xla import xla_attention
from bert_jax.models.layers import sharding_context
from bert_jax.models.masking import Masking, Pattern, bigbird_blocks, pattern_of

# splash's BlockSizes: (field, its q block, its kv block) of the forward, dkv and dq kernels
# and the *_compute sub-tiles; model.attention_<field> sets each (0: model.attention_block_size).
BLOCK_FIELDS = ("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
                "block_kv_dkv_compute", "block_q_dq", "block_kv_dq")
KERNELS = (("forward", "block_q", "block_kv", 2),  # (kernel, its tiles, matmuls per tile)
           ("dkv", "block_q_dkv", "block_kv_dkv", 4),  # QK^T, dP, dV, dK
           ("dq", "block_q_dq", "block_kv_dq", 3))  # QK^T, dP, dQ

BLOCK_ERROR = ("model.attention_kernel=splash tiles a sequence of {length} tokens in blocks of "
               "min(model.{key}={block}, {length}), which must be a multiple of 128 that "
               "divides {length}{within}; choose a block size and sequence length (data."
               "max_seq_length) that are multiples of 128, or model.attention_kernel=xla")

SMEM_ERROR = ("model.attention_kernel=splash at {length:,} tokens in {q} x {kv}-token tiles: "
              "its {kernel} kernel's mask info ({need:,} bytes) exceeds a TPU core's "
              "{smem:,}-byte scalar memory (SMEM); set model.attention_block_size={fix} (larger "
              "tiles, fewer of them) or a shorter data.max_seq_length")


_DEFAULTS = ModelConfig()  # the block sizes of a call given none


def _default_block(device_kind: str | None, length: int) -> int:
    """The generation's block (chips.py; 128 for other devices), halved until it divides
    `length`, at most `length`."""
    gen = chips.generation(device_kind or "")
    block = min(gen.splash_block if gen else 128, length)
    while block > 128 and length % block:
        block //= 2
    return block


def block_sizes(cfg: ModelConfig, length: int, device_kind: str | None = None
                ) -> dict[str, tuple[str, int]]:
    """Each BlockSizes field at `length` on a `device_kind` device: (the model key that set it,
    its size): model.attention_<field>, else model.attention_block_size, each min(it, length);
    where both are 0, the generation's block (`_default_block`)."""
    sizes = {}
    for field in BLOCK_FIELDS:
        own, common = getattr(cfg, f"attention_{field}"), cfg.attention_block_size
        key = f"attention_{field}" if own else "attention_block_size"
        sizes[field] = (key, min(own or common, length) if own or common
                        else _default_block(device_kind, length))
    return sizes


def block_error(cfg: ModelConfig, length: int) -> str | None:
    """Why splash cannot tile `length` with cfg's blocks, or None. (A length that 128 does not
    tile fails every generation's default, which halves down to 128: the message says 128.)"""
    sizes = block_sizes(cfg, length)
    for field, (key, block) in sizes.items():
        whole, within = length, ""
        if field.endswith("_compute"):  # a sub-tile of its kernel's kv tile
            outer_key, whole = sizes[field[:-len("_compute")]]
            within = f" and {whole} (model.{outer_key})"
        if block % 128 or whole % block:  # splash's tiles fill whole 128-lane vregs
            return BLOCK_ERROR.format(key=key, block=getattr(cfg, key) or 128, length=length,
                                      within=within)
    return None


def mask_info_bytes(rows: int, cols: int, *, dkv: bool = False, bigbird: bool = False) -> int:
    """The bytes of a kernel's mask info over a full [rows, cols] grid of tiles: data_next
    (int8 while the tiles it indexes, kv's or for dkv q's, number at most 128; else int16) and
    block_mask (int8), and for BigBird's partial tiles mask_next (int32 at worst)."""
    index = 1 if (rows if dkv else cols) <= 128 else 2  # indices up to 127
    return rows * cols * (index + 1 + (4 if bigbird else 0))


def smem_error(cfg: ModelConfig, length: int, device_kind: str | None = None, *,
               causal: bool = False, full_grid: bool | None = None) -> str | None:
    """Why splash's mask info cannot fit a TPU core's scalar memory at `length` in cfg's tiles
    on a `device_kind` device, or None. Per [q, kv] tile of its grid each kernel keeps in SMEM
    the next tile to fetch (int8; int16 past 128 tiles) and whether the tile is empty, partial
    or full (int8) (splash_attention_mask_info); a window alone shrinks the grid to the band's
    few columns, so only a layer that sees every key's tiles (`full_grid`; default: whether
    cfg has one: a global layer, the full pattern, causal, BigBird) sets the size, and BigBird's
    partial tiles add an index each (int32 at worst). Segment ids are not there: they stream
    through VMEM a tile at a time."""
    bigbird = cfg.attention_pattern == "bigbird"
    if full_grid is None:
        window, pattern = pattern_of(cfg, cfg.num_layers)
        full_grid = (window is None or causal or bigbird or pattern is not None
                     and any(pattern.is_global(i) for i in range(cfg.num_layers)))
    if not full_grid:
        return None
    sizes = block_sizes(cfg, length, device_kind)
    for name, q, kv, _ in KERNELS:
        need = mask_info_bytes(length // sizes[q][1], length // sizes[kv][1], dkv=name == "dkv",
                               bigbird=bigbird)
        if need > chips.SMEM_BYTES:
            fix = next(b for b in (256, 512, 1024, 2048, 4096, length) if not length % b and
                       mask_info_bytes(length // b, length // b, bigbird=bigbird) <= chips.SMEM_BYTES)
            return SMEM_ERROR.format(length=length, q=sizes[q][1], kv=sizes[kv][1], kernel=name,
                                     need=need, smem=chips.SMEM_BYTES, fix=fix)
    return None


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


def splash_blocks(T: int, S: int, block: int, *, causal: bool = False, window: int | None = None,
                  pattern: Pattern | None = None, layer: int = 0, block_kv: int | None = None) -> int:
    """The [block, block_kv] tiles (block_kv: default block) splash visits in one head of one row
    at layer `layer`: those its static mask (`_splash_mask`) leaves non-empty (segment ids skip
    nothing statically)."""
    m = Masking(None, None, None, None, causal=causal, window=window, pattern=pattern)
    mask, bkv = _splash_mask(m, T, S, layer), block_kv or block
    # each tile's first and last query and key; the band masks by arithmetic (32k tokens' masks
    # sliced take seconds), BigBird's numpy mask by its tiles
    q0, k0 = np.arange(0, T, block)[:, None], np.arange(0, S, bkv)[None, :]
    q1, k1 = q0 + block - 1, k0 + bkv - 1
    if isinstance(mask, splash.FullMask):
        return (T // block) * (S // bkv)
    if isinstance(mask, splash.CausalMask):  # s <= t
        return int((k0 <= q1).sum())
    if isinstance(mask, splash.LocalMask):  # t - left <= s <= t + right
        left, right = mask.window_size
        return int(((k0 <= q1 + right) & (k1 >= q0 - left)).sum())
    return sum(int(mask[i:i + block, :].reshape(-1, S // bkv, bkv).any(axis=(0, 2)).sum())
               for i in range(0, T, block))


def splash_flops(cfg: ModelConfig, batch: int, length: int, *, causal: bool = False,
                 layers: int | None = None, training: bool = True,
                 device_kind: str | None = None) -> float:
    """Splash's matmul FLOPs for `batch` rows of `length` tokens through a stack of self-attention
    layers (default cfg.num_layers) of cfg's heads and pattern, in the tiles of cfg's block sizes
    on a `device_kind` device (`block_sizes`): per tile a kernel visits, 2 matmuls forward (QK^T,
    PV) and, training, 4 in the dkv kernel (QK^T, dP, dV, dK) and 3 in the dq kernel (QK^T, dP,
    dQ), each 2 * block_q * block_kv * head_dim FLOPs per head. Larger tiles visit more of a
    window's empty corners. XLA's cost analysis cannot see inside the kernel."""
    layers = cfg.num_layers if layers is None else layers
    window, pattern = pattern_of(cfg, layers)
    kinds = pattern.layer_kinds() if pattern is not None else [0] * layers
    sizes = block_sizes(cfg, length, device_kind)
    total = 0
    for _, q, kv, matmuls in KERNELS if training else KERNELS[:1]:
        bq, bkv = sizes[q][1], sizes[kv][1]
        visited: dict[int, int] = {}
        for i, kind in enumerate(kinds):
            if kind not in visited:
                visited[kind] = splash_blocks(length, length, bq, causal=causal, window=window,
                                              pattern=pattern, layer=i, block_kv=bkv)
        total += sum(visited[k] for k in kinds) * matmuls * 2 * bq * bkv * cfg.head_dim
    return float(total * cfg.num_heads * batch)


def splash_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                     dropout_rate: float = 0.0, rng: Array | None = None,
                     return_probs: bool = False, blocks: ModelConfig | None = None
                     ) -> tuple[Array, Array | None]:
    """Pallas splash attention (TPU; interpret mode on CPU): flash attention over the blocks the
    flags leave non-empty, packed rows through segment ids, in the tiles of `blocks`' block sizes
    (`block_sizes` on the devices it runs on; None: the defaults). Inside
    a sharded step it runs per shard under shard_map (batch over the batch axes, heads over
    `tensor`). Returning probabilities, incremental decoding, cross-attention and lengths it
    cannot tile go to xla."""
    T, S = q_BTNK.shape[1], k_BSNK.shape[1]
    xla_instead = ("returning attention probabilities" if return_probs
                   else "cross-attention" if masking.cross
                   else "incremental decoding" if T != S or not isinstance(masking.q_offset, int)
                   or masking.q_offset
                   # training lengths are checked up front (check); inference may bring others
                   else f"a length of {T} (not in 128-multiple tiles)"
                   if block_error(blocks or _DEFAULTS, T) else None)
    if xla_instead:
        say_once(f"model.attention_kernel=splash: {xla_instead} runs with the xla kernel")
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=dropout_rate, rng=rng,
                             return_probs=return_probs)
    if rng is not None:
        refuse_dropout("splash", dropout_rate)
    where = platform()
    SPLASH.check_platform(where)
    ctx = sharding_context()
    kind = (ctx.mesh.devices.flat[0] if ctx is not None else jax.devices()[0]).device_kind
    p = masking.pattern  # a traced layer index compiles every layer kind's kernel
    full_grid = (masking.window is None or masking.causal or p is not None and (
        p.block or not isinstance(masking.layer, int) or p.is_global(masking.layer)))
    refused = smem_error(blocks or _DEFAULTS, T, kind, causal=masking.causal,
                         full_grid=bool(full_grid))
    if refused:
        raise UnsupportedAttention(refused)
    sizes = splash.BlockSizes(**{f: b for f, (_, b) in block_sizes(blocks or _DEFAULTS, T, kind).items()})
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
        heads_first = (lambda x: x.transpose(0, 2, 1, 3))  # [B, T, N, K] <-> [B, N, T, K]

        def run(layer):
            mask = splash.MultiHeadMask([_splash_mask(masking, T, S, layer)] * N)
            fn = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                        interpret=where == "cpu")
            return lambda *args: jax.vmap(fn)(*args[:3], segment_ids=splash.SegmentIds(*args[3:]))

        args = (heads_first(q_BTNK), heads_first(k_BSNK), heads_first(v_BSNK), q_seg_BT, kv_seg_BS)
        if len(layers) == 1:
            return heads_first(run(layers[0])(*args))
        return heads_first(jax.lax.switch(pick, [run(i) for i in layers], *args))

    if ctx is None:
        return per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick), None
    batch, _, heads, _ = ctx.spec(("batch", "length", "heads", "kv"), q_BTNK.shape)
    spec_BTNK, spec_BT = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
    sharded = jax.shard_map(per_shard, mesh=ctx.mesh,
                            in_specs=(spec_BTNK,) * 3 + (spec_BT,) * 2 + (PartitionSpec(),),
                            out_specs=spec_BTNK, check_vma=False)
    return sharded(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick), None


class Splash(Kernel):
    """Pallas splash attention: TPU, and CPU in interpret mode (the tests)."""

    name = "splash"
    platforms = ("tpu", "cpu")
    reads_block_size = True
    opaque = True

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        return splash_attention(q_BTNK, k_BSNK, v_BSNK, masking, **options)

    def wrong_platform(self, platform: str) -> str:
        return (f"model.attention_kernel=splash runs on TPU (and on CPU in interpret mode), not "
                f"on {platform}; choose model.attention_kernel=xla")

    def check(self, cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
        if training:
            refuse_dropout(self.name, cfg.attention_dropout_rate)
        for length in lengths:
            refused = block_error(cfg, length)
            if refused:
                raise UnsupportedAttention(refused)

    def options(self, cfg: ModelConfig) -> dict:
        return {"blocks": cfg}  # its block sizes, resolved per length and device (block_sizes)

    def check_data(self, cfg: ModelConfig, *, packed: bool) -> None:
        if packed and cfg.attention_pattern == "bigbird":
            raise UnsupportedAttention(
                "model.attention_pattern=bigbird with model.attention_kernel=splash and "
                "data.pack=True: splash's static mask makes only each row's first blocks global, "
                "not each packed example's; set data.pack=False or model.attention_kernel=xla")

    def check_device(self, cfg: ModelConfig, length: int, device_kind: str, *,
                     causal: bool = False) -> None:
        refused = smem_error(cfg, length, device_kind, causal=causal)
        if refused:
            raise UnsupportedAttention(refused)

    def flops(self, cfg: ModelConfig, batch: int, length: int, *, training: bool,
              causal: bool = False, layers: int | None = None,
              device_kind: str | None = None) -> float:
        """The tiles it visits (`splash_flops`), not the keys the pattern leaves."""
        return splash_flops(cfg, batch, length, causal=causal, layers=layers, training=training,
                            device_kind=device_kind)


SPLASH = register(Splash())
