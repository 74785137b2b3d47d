"""Who may attend to whom: the `Masking` every attention kernel receives, the per-layer
`Pattern` (global layers among local ones, BigBird's blocks), and the pattern arithmetic
(which layers are global, the keys a query visits) that the kernels, their FLOPs and the
model's FLOPs count all use. Shape suffixes as in layers.py; of the models it imports only
their configs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from bert_jax.models.config import ModelConfig

Array = jax.Array


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


def is_global(layer: Array | int, every: int) -> Array | bool:
    """Whether layer `layer` of a windowed stack sees every key: layer 0 and every `every`-th
    after it (ModernBERT's convention; every=0: none). The one place that says so."""
    return every > 0 and layer % every == 0


@dataclasses.dataclass(frozen=True)
class Pattern:
    """What varies by layer (the Masking's `layer`) or goes beyond a window: with a window,
    layer i is global (sees every key) when `is_global(i, global_every)`; BigBird (block > 0),
    in blocks of `block` tokens by index: a query block sees the keys of the `window_blocks`
    blocks on each side of its own and `random_blocks` random key blocks (numpy's generator
    seeded by (layer, blocks per row): fixed for a checkpoint); and tokens whose position is
    below block * global_blocks (each packed example's first blocks, its [CLS] included) see,
    and are seen by, every token of their example."""

    num_layers: int = 1
    global_every: int = 0
    block: int = 0
    window_blocks: int = 0
    global_blocks: int = 0
    random_blocks: int = 0

    def is_global(self, layer: Array | int) -> Array | bool:
        return is_global(layer, self.global_every)

    def layer_kinds(self) -> list[int]:
        """A key per layer: layers with the same key have the same static mask (for a window:
        1 in the global layers, 0 in the local ones)."""
        if self.block:
            return list(range(self.num_layers)) if self.random_blocks else [0] * self.num_layers
        return [int(self.is_global(i)) for i in range(self.num_layers)]


def pattern_of(cfg: ModelConfig, num_layers: int = 1) -> tuple[int | None, Pattern | None]:
    """(the window, the Pattern) of a model config's self-attention in a stack of `num_layers`
    (the layer stack sets its own depth through Masking.in_layer)."""
    window = cfg.attention_window or None
    if cfg.attention_pattern == "bigbird":
        return None, Pattern(num_layers=num_layers, block=cfg.bigbird_block,
                             window_blocks=cfg.bigbird_window_blocks,
                             global_blocks=cfg.bigbird_global_blocks,
                             random_blocks=cfg.bigbird_random_blocks)
    if window is not None and cfg.attention_global_every:
        return window, Pattern(num_layers=num_layers, global_every=cfg.attention_global_every)
    return window, None


def attention_keys(cfg: ModelConfig, seq_len: int) -> float:
    """The keys a query visits, averaged over the layers and queries: seq_len; the 2W+1 of a
    local window W (seq_len in its global layers); BigBird's window, global and random blocks
    (its global queries see every key); linformer's k."""
    if cfg.attention_pattern == "linformer":
        return min(seq_len, cfg.linformer_k)
    if cfg.attention_pattern == "bigbird":
        b = cfg.bigbird_block
        n = -(-seq_len // b)
        g = min(n, cfg.bigbird_global_blocks)
        rest = min(n, 2 * cfg.bigbird_window_blocks + 1 + g + cfg.bigbird_random_blocks)
        return min(seq_len, b * (g * n + (n - g) * rest) / n)
    window, pattern = pattern_of(cfg, cfg.num_layers)
    if window is None:
        return seq_len
    local = min(seq_len, 2 * window + 1)
    globals_ = sum(pattern.layer_kinds()) if pattern is not None else 0
    return (globals_ * seq_len + (cfg.num_layers - globals_) * local) / cfg.num_layers


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

