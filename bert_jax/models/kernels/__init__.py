"""Attention kernels, one file each: a `Kernel` subclass whose instance registers itself in
`KERNELS` when its module is imported; `model.attention_kernel` names one of them.

A kernel carries its facts: its `name`; the `platforms` it runs on (None: wherever XLA runs)
and the message for any other; whether it reads model.attention_block_size; what it refuses
before anything compiles (`check` for a model config at some sequence lengths, `check_data`
for packed rows: each raises UnsupportedAttention naming the config field to change); its
attention FLOPs (`flops`; `opaque`: XLA's cost analysis cannot see them, so `plan` counts
them beside it); and the call itself, `kernel(q, k, v, masking, dropout_rate=, rng=,
return_probs=, **options)` -> (output [B, T, N, K], probabilities [B, N, T, S] or None),
which may hand a case it cannot compute to the xla kernel (saying so once).

To add a kernel: one file (here, or anywhere imported before the config is built: a test
file does) with a Kernel subclass and `register(MyKernel())`; models/attention.py, the
model config's choices and `plan` ask the registry. The built-in ones (xla, the reference;
splash, Pallas for TPU; cudnn, GPU) are imported at the bottom. This package imports only
jax and the models' masking, layers and config modules.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import jax

from bert_jax.models.layers import sharding_context
from bert_jax.models.masking import Masking, attention_keys

if TYPE_CHECKING:
    from bert_jax.models.config import ModelConfig

Array = jax.Array
log = logging.getLogger(__name__)


class UnsupportedAttention(ValueError):
    """A kernel asked for a masking, dtype or option it cannot compute."""


DROPOUT_ERROR = ("model.attention_dropout_rate={rate} with model.attention_kernel={kernel}: "
                 "{kernel} has no dropout on the attention probabilities; set "
                 "model.attention_dropout_rate=0 or use model.attention_kernel=xla")


class Kernel:
    """An attention implementation and its facts; subclasses set them and define __call__."""

    name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...] | None] = None  # jax platform names; None: anywhere
    reads_block_size: ClassVar[bool] = False  # reads model.attention_block_size (and its fields)
    opaque: ClassVar[bool] = False  # a custom call: XLA's cost analysis does not count it

    def __call__(self, q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                 dropout_rate: float = 0.0, rng: Array | None = None,
                 return_probs: bool = False, **options) -> tuple[Array, Array | None]:
        raise NotImplementedError

    def wrong_platform(self, platform: str) -> str:
        """The message when this kernel cannot run on `platform`."""
        return (f"model.attention_kernel={self.name} runs on {', '.join(self.platforms or ())}, "
                f"not on {platform}; choose model.attention_kernel=xla")

    def check_platform(self, platform: str) -> None:
        if self.platforms is not None and platform not in self.platforms:
            raise UnsupportedAttention(self.wrong_platform(platform))

    def options(self, cfg: ModelConfig) -> dict:
        """The keyword options of the call that come from the model config."""
        return {"block_size": cfg.attention_block_size} if self.reads_block_size else {}

    def check(self, cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
        """What this kernel cannot compute for `cfg` at these sequence lengths (training: with
        the config's dropout), beyond what any kernel refuses (attention.check)."""

    def check_data(self, cfg: ModelConfig, *, packed: bool) -> None:
        """What this kernel cannot compute with the model's batches (packed: data.pack)."""

    def check_device(self, cfg: ModelConfig, length: int, device_kind: str, *,
                     causal: bool = False) -> None:
        """What this kernel cannot compute at `length` on a `device_kind` device (`plan`
        asks before compiling for a slice; the call itself refuses it too)."""

    def flops(self, cfg: ModelConfig, batch: int, length: int, *, training: bool,
              causal: bool = False, layers: int | None = None,
              device_kind: str | None = None) -> float:
        """The attention matmul FLOPs (QK^T and PV; training: their 4 backward matmuls too) of
        `batch` rows of `length` tokens through a self-attention stack of `layers` layers
        (default cfg.num_layers) on a `device_kind` device: by default over the keys the
        pattern leaves each query, as the model's FLOPs count them (masking.attention_keys;
        causal masks count every key)."""
        layers = cfg.num_layers if layers is None else layers
        per_layer = 2 * 2 * attention_keys(cfg, length) * cfg.num_heads * cfg.head_dim
        return float(per_layer * layers * batch * length * (3 if training else 1))


KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    """Make `kernel` choosable as model.attention_kernel=kernel.name."""
    KERNELS[kernel.name] = kernel
    return kernel


def get(name: str) -> Kernel:
    """The kernel named `name`; an unknown name is an error naming the field and the choices."""
    if name not in KERNELS:
        raise UnsupportedAttention(f"model.attention_kernel={name!r}; choose one of {sorted(KERNELS)}")
    return KERNELS[name]


def refuse_dropout(name: str, rate: float) -> None:
    """The kernels without dropout on the probabilities refuse a rate above 0."""
    if rate > 0.0:
        raise UnsupportedAttention(DROPOUT_ERROR.format(rate=rate, kernel=name))


_SAID: set[str] = set()


def say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        log.info(line)


def platform() -> str:
    """Where the step runs: the mesh's devices inside a sharded step (`plan` traces for a TPU
    mesh on a CPU machine), else the default backend."""
    ctx = sharding_context()
    return ctx.mesh.devices.flat[0].platform if ctx is not None else jax.default_backend()


# The built-in kernels register themselves (imported last: they import the names above).
from bert_jax.models.kernels import cudnn, splash, xla  # noqa: E402, F401
