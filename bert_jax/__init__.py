"""bert_jax: the Transformer and BERT in JAX/Flax NNX."""

from bert_jax import log as _log  # noqa: F401 (installs the package logger's console handler)
from bert_jax import tpu as _tpu

_tpu.quiet_libtpu_off_tpu()  # before JAX starts: libtpu installed on a machine with no TPU
