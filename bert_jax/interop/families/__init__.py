"""Hugging Face checkpoint families (BERT, RoBERTa, ModernBERT), one file each, each a `Family`
that registers itself: its config.json model_type, its architectures (our model name <-> HF
class), its config.json to and from our `model` section, its tensor names both ways (renames,
fused tensors split and fused back) and its tokenizer kind. A model config declares its family
(model.hf_family); convert looks one up by config.json's model_type, export by that field.

To add a family: one file here that defines a Family (subclass) and calls `register` on it (every
module here is imported below), and its name among model.hf_family's choices
(models.config.HF_FAMILIES).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from bert_jax import models
from bert_jax.models.config import HF_FAMILIES


@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face checkpoint family, on our BERT models. Tensor names between a family
    and the generic convert/export code are BERT's, relative to the encoder (as a bare
    BertModel names them); a family renames its own to and from those."""

    name: str  # our model.hf_family
    model_type: str  # config.json's
    title: str  # in messages: "RoBERTa"
    architectures: dict[str, str]  # our model name -> the HF class export writes
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)  # other HF classes convert reads
    tokenizer: str = "wordpiece"  # the kind its HF classes read: convert reads it first
    # Tokenizer kinds export writes as they are (the first is named when a checkpoint has none).
    tokenizers: tuple[str, ...] = ("wordpiece",)
    prefix: str = ""  # where its HF task models keep the encoder's tensors (a bare encoder: none)
    # Tensor name prefixes no other family's checkpoints have: a folder whose config.json says
    # one family and whose tensors carry another's is refused (it would convert, wrongly).
    signature: tuple[str, ...] = ()
    nsp: bool = True  # its pretraining class has the NSP head (and the pooler it reads)
    pooler: bool = True  # its bare encoder class has a pooler
    # tokenizer_config.json entries export adds where it writes the tokenizer
    tokenizer_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    known: ClassVar[dict[str, Family]] = {}

    def config_from_hf(self, hf: dict[str, Any], name: str, use_pooler: bool) -> dict[str, Any]:
        """Our `model` section (model `name`) of this family's config.json `hf`."""
        raise NotImplementedError

    def misfits(self, cfg: models.BertConfig, ids: dict[str, int]) -> list[str]:
        """What keeps model config `cfg` from being written as this family, one entry a field."""
        raise NotImplementedError

    def config_to_hf(self, name: str, cfg: models.BertConfig, ids: dict[str, int]) -> dict[str, Any]:
        """The config.json of our model `name` with config `cfg` (misfits already refused);
        `ids`: the tokenizer's pad, cls and sep ids where known."""
        raise NotImplementedError

    def normalise(self, name: str) -> str:
        """A checkpoint tensor's name as BERT's, relative to the encoder (one-to-one renames)."""
        return name.removeprefix(self.prefix)

    def from_hf(self, weights: dict[str, np.ndarray], model_name: str, num_layers: int
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The checkpoint's tensors under BERT's names (normalise; fused ones split), and {BERT
        name: the checkpoint's name} for messages."""
        out = {self.normalise(k): v for k, v in weights.items()}
        return out, {self.normalise(k): k for k in weights}

    def to_hf(self, tensors: dict[str, np.ndarray], model_name: str, num_layers: int
              ) -> dict[str, np.ndarray]:
        """The inverse of from_hf: BERT-named tensors of our model `model_name` as this family's
        HF class names them."""
        raise NotImplementedError

    def check_weights(self, names: Iterable[str], config_file: object) -> None:
        """Tensors named as another family's are a ValueError naming `config_file`, its
        model_type, the tensor and what to do."""
        others = [f for f in Family.known.values() if f is not self]
        for name in names:
            other = next((f for f in others if name.startswith(f.signature)), None)
            if other is not None:
                raise ValueError(
                    f"{config_file}: model_type={self.model_type!r} but the weights are a "
                    f"{other.title}'s (tensor {name!r}); this config does not belong to these "
                    f"weights: use the one that came with them (model_type={other.model_type!r})")


def register(family: Family) -> Family:
    """Makes `family` known to convert (by its model_type) and export (by its name)."""
    Family.known[family.name] = family
    return family


def get(name: str) -> Family:
    """The family of model.hf_family `name`."""
    return Family.known[name]


def for_model_type(model_type: str) -> Family:
    """The family of config.json's `model_type`; an unknown one is a ValueError naming it."""
    found = next((f for f in Family.known.values() if f.model_type == model_type), None)
    if found is None:
        order = sorted(Family.known.values(), key=lambda f: HF_FAMILIES.index(f.name))
        supported = ", ".join(repr(f.model_type) for f in order)
        raise ValueError(f"config.json: model_type={model_type!r} does not convert; supported "
                         f"model_type: {supported}")
    return found


def architectures() -> dict[str, str]:
    """{HF class: our model name} of every family, aliases included."""
    return {hf: ours for f in Family.known.values()
            for hf, ours in ({v: k for k, v in f.architectures.items()} | f.aliases).items()}


for _module in pkgutil.iter_modules(__path__):  # each registers its family
    importlib.import_module(f"{__name__}.{_module.name}")
