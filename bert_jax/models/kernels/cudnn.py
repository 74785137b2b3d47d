"""The cudnn kernel: cuDNN flash attention on a GPU through jax.nn.dot_product_attention, with
the masks that function takes instead of a dense one (`dpa_attention`, which also runs with
implementation="xla" anywhere: the CPU tests' check of the mapping); what it refuses (dropout,
bidirectional windows, BigBird, packed rows, float32, some head dims). Shape suffixes as in
layers.py."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

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
from bert_jax.models.masking import Masking

BIGBIRD_ERROR = ("model.attention_pattern=bigbird with model.attention_kernel=cudnn: cuDNN's "
                 "masks (sequence lengths, causal, a causal window) cannot express bigbird's "
                 "blocks; choose model.attention_kernel=xla (or splash on TPU)")
WINDOW_ERROR = ("model.attention_window={window} with model.attention_kernel=cudnn: cuDNN's "
                "sliding window (jax.nn.dot_product_attention) is causal only, and this "
                "model's attention is bidirectional; choose model.attention_kernel=xla (or "
                "splash on TPU), or model.attention_window=0")
DTYPE_ERROR = ("dtype={dtype} with model.attention_kernel=cudnn: cuDNN flash attention computes "
               "in bfloat16 or float16; set --config.dtype=bfloat16, or "
               "model.attention_kernel=xla")
HEAD_ERROR = ("model.head_dim={head_dim} with model.attention_kernel=cudnn: cuDNN flash "
              "attention needs a head dim that is a multiple of 8 and at most 256 (128 before "
              "Hopper); choose such a head_dim or model.attention_kernel=xla")


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
        say_once(f"{name}: {xla_instead} runs with the xla kernel")
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=dropout_rate, rng=rng,
                             return_probs=return_probs)
    if rng is not None:
        refuse_dropout(implementation, dropout_rate)
    if implementation == "cudnn":
        CUDNN.check_platform(platform())
    p, window = masking.pattern, masking.window
    if p is not None and p.block:
        raise UnsupportedAttention(BIGBIRD_ERROR)
    if window is not None and not masking.causal:
        raise UnsupportedAttention(WINDOW_ERROR.format(window=window))
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


class CuDNN(Kernel):
    """cuDNN flash attention: GPU only, unpacked rows, bfloat16/float16."""

    name = "cudnn"
    platforms = ("gpu",)
    opaque = True

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        return cudnn_attention(q_BTNK, k_BSNK, v_BSNK, masking, **options)

    def wrong_platform(self, platform: str) -> str:
        return (f"model.attention_kernel=cudnn needs a GPU (cuDNN flash attention), not "
                f"{platform}; choose model.attention_kernel=xla"
                + (" (or splash)" if platform == "tpu" else ""))

    def check(self, cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
        if training:
            refuse_dropout(self.name, cfg.attention_dropout_rate)
        if cfg.attention_pattern == "bigbird":
            raise UnsupportedAttention(BIGBIRD_ERROR)
        if cfg.attention_window and type(cfg).family != "decoder-only":  # bidirectional somewhere
            raise UnsupportedAttention(WINDOW_ERROR.format(window=cfg.attention_window))
        if cfg.dtype not in ("bfloat16", "float16"):
            raise UnsupportedAttention(DTYPE_ERROR.format(dtype=cfg.dtype))
        if cfg.head_dim % 8 or cfg.head_dim > 256:
            raise UnsupportedAttention(HEAD_ERROR.format(head_dim=cfg.head_dim))

    def check_data(self, cfg: ModelConfig, *, packed: bool) -> None:
        if packed or type(cfg).family != "BERT":
            rows = ("data.pack=True" if packed else
                    f"the {type(cfg).family} models' batches (packed rows with segment ids)")
            raise UnsupportedAttention(
                f"model.attention_kernel=cudnn with {rows}: cuDNN's masks (sequence lengths) "
                f"cannot keep the sequences of a packed row apart; "
                + ("set data.pack=False or " if packed else "")
                + "choose model.attention_kernel=xla (or splash on TPU)")


CUDNN = register(CuDNN())
