"""Model configs, one per model family, sharing a common core: `ModelConfig` holds the fields
every model reads; `BertConfig` (bert, bert_pretraining and the BERT task heads),
`DecoderLMConfig` (decoder_lm) and `EncoderDecoderConfig` (transformer) add their own. A
model's `model` config section holds exactly the fields that model reads, so a setting a model
would ignore is an error naming the field and the model (models.split_model_config).

Each field says in its metadata, in one place:
  kind      what it is to a checkpoint: "architecture" (pretrained weights fit only a model
            with the same value; init_from compares these), "state" (a run resumes only with the
            same value: the parameters' tree and what they compute), or "run" (free to change
            between runs of the same weights: dropout, initialisation, execution, dtype);
  flops     whether the FLOPs count (models.flops_per_token) depends on it (a test checks it);
  choices, least: the values it may take (checked at creation);
  only      the models of its family that read it (default: all of them).
The checkpoint compatibility lists (training/checkpoint.py) and the test that the FLOPs count
reads exactly the `flops` fields (tests/unit/models/test_model_configs.py) follow this metadata.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

DTYPES = ("float32", "bfloat16")  # compute dtypes; parameters are always float32

REMAT_POLICIES = {
    "none": None,  # no rematerialisation
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

KINDS = ("architecture", "state", "run")

# full: every key (or a local window, model.attention_window); bigbird: window, global and
# random blocks; linformer: keys and values projected along the sequence (models/attention.py).
PATTERNS = ("full", "bigbird", "linformer")

# learned: a position table (max_len rows); sinusoidal: the paper's fixed encoding, added to the
# embeddings; rope: rotary embeddings on each self-attention's queries and keys (no table).
POSITIONS = ("learned", "sinusoidal", "rope")

# The Hugging Face checkpoint families of the BERT models (bert_jax/interop/families: one file each).
HF_FAMILIES = ("bert", "roberta", "modernbert")
# A learned similarity scale (model.learn_scale) stays at most this, as CLIP's logit scale.
LEARNED_SCALE_CAP = 100.0
# What HF's ModernBERT classes always are (the rest of our switches they express): a model that
# declares hf_family='modernbert' trains only with these (config.validate), so that it exports.
MODERNBERT_FIXED = {"positions": "rope", "task_head": "modernbert", "norm": "pre",
                    "normalization": "layernorm", "mlp_layer": "glu", "embedding_norm": True,
                    "type_vocab_size": 0, "position_offset": 0, "attention_pattern": "full"}


# A field's declared type: the values it takes, and how a message names them.
_KINDS = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
}


def _field(default: Any, kind: str, *, flops: bool = False, choices: tuple | None = None,
           least: int | None = None, only: tuple[str, ...] | None = None) -> Any:
    """A config field with its metadata (see the module docstring)."""
    assert kind in KINDS, kind
    meta = {"kind": kind, "flops": flops, "choices": choices, "least": least, "only": only}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The fields every model family reads (BERT defaults)."""

    family: ClassVar[str] = "common"

    vocab_size: int = _field(30522, "architecture", flops=True, least=1)
    emb_dim: int = _field(768, "architecture", flops=True, least=1)  # d_model / hidden_size
    num_layers: int = _field(12, "architecture", flops=True, least=1)  # encoder (or decoder-only) layers
    num_heads: int = _field(12, "architecture", flops=True, least=1)
    head_dim: int = _field(64, "architecture", flops=True, least=1)  # d_k = d_v
    mlp_dim: int = _field(3072, "architecture", flops=True, least=1)  # d_ff / intermediate_size
    max_len: int = _field(512, "architecture", least=1)  # learned position table size
    activation: str = _field("gelu", "architecture",  # gelu: exact erf, as BERT
                             choices=("relu", "gelu", "gelu_tanh", "silu"))
    norm: str = _field("post", "architecture",  # post: LN(x + f(x)) (paper, BERT); pre: x + f(LN(x))
                       choices=("post", "pre"))  # pre adds a final norm after the last layer
    normalization: str = _field("layernorm", "architecture", choices=("layernorm", "rmsnorm"))
    norm_bias: bool = _field(True, "architecture")  # the LayerNorms' bias (rmsnorm has none)
    use_bias: bool = _field(True, "architecture")  # biases of the attention, FFN and head dense layers
    # mlp: act(x W_i) W_o; glu: (act(x W_i) * x W_gate) W_o (activation gelu: GeGLU, silu: SwiGLU)
    mlp_layer: str = _field("mlp", "architecture", flops=True, choices=("mlp", "glu"))
    positions: str = _field("learned", "architecture", choices=POSITIONS)
    rope_theta: float = _field(10000.0, "architecture")  # rope's base (in global layers)
    rope_local_theta: float = _field(0.0, "architecture")  # in local (windowed) layers; 0: rope_theta
    dropout_rate: float = _field(0.1, "run")  # embeddings, residual branches, heads
    attention_dropout_rate: float = _field(0.1, "run")  # on the attention probabilities
    # On each attention sublayer's output (after its output projection, before the residual add:
    # ModernBERT's attn_out_dropout_prob); -1: dropout_rate, as BERT's hidden dropout covers it.
    attention_output_dropout_rate: float = _field(-1.0, "run")
    layer_norm_eps: float = _field(1e-12, "run")
    # BERT's | Vaswani's | ModernBERT's (by role: models/layers.py kernel_init)
    initializer: str = _field("truncated_normal", "run",
                              choices=("truncated_normal", "xavier_uniform", "full_megatron"))
    initializer_range: float = _field(0.02, "run")  # truncated_normal's stddev (full_megatron's base)
    scan_layers: bool = _field(False, "run")  # lax.scan over layers (compile time independent of depth)
    remat_policy: str = _field("none", "run", choices=tuple(REMAT_POLICIES))
    attention_kernel: str = _field("xla", "run")  # a registered kernel's name (models/kernels/)
    # Splash's tiles, each min(this, length); 0: the TPU generation's (chips.py: 128 to 1,024),
    # halved until it divides the length (128 off TPU). The fields of splash's BlockSizes below
    # (forward, dkv and dq kernels; *_compute: the sub-tile a matmul takes) default to this one.
    attention_block_size: int = _field(0, "run", least=0)
    attention_block_q: int = _field(0, "run", least=0)
    attention_block_kv: int = _field(0, "run", least=0)
    attention_block_kv_compute: int = _field(0, "run", least=0)
    attention_block_q_dkv: int = _field(0, "run", least=0)
    attention_block_kv_dkv: int = _field(0, "run", least=0)
    attention_block_kv_dkv_compute: int = _field(0, "run", least=0)
    attention_block_q_dq: int = _field(0, "run", least=0)
    attention_block_kv_dq: int = _field(0, "run", least=0)
    attention_window: int = _field(0, "state", flops=True, least=0)  # local: |t - s| <= W; 0 = all
    # Sparse patterns (models/attention.py, docs/attention.md): with a window, layer i is global
    # (full) when i % n == 0 (ModernBERT's convention); bigbird's blocks; linformer (BERT only).
    attention_global_every: int = _field(0, "state", flops=True, least=0)  # 0: no global layers
    attention_pattern: str = _field("full", "state", flops=True, choices=PATTERNS)
    bigbird_block: int = _field(64, "state", flops=True, least=1)  # tokens per block
    bigbird_window_blocks: int = _field(1, "state", flops=True, least=0)  # on each side of its own
    bigbird_global_blocks: int = _field(1, "state", flops=True, least=0)  # each example's first
    bigbird_random_blocks: int = _field(3, "state", flops=True, least=0)  # per query block
    dtype: str = _field("float32", "run", choices=DTYPES)  # compute dtype; parameters stay float32

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            # (a value read from a JSON file, e.g. convert's config.json, has whatever type it has)
            if f.type in _KINDS and not _KINDS[f.type][0](value):
                raise ValueError(f"model.{f.name}={value!r}: expected {_KINDS[f.type][1]}")
            if meta["choices"] is not None and value not in meta["choices"]:
                raise ValueError(f"model.{f.name}={value!r}; choose one of {meta['choices']}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"model.{f.name}={value!r}: a finite number is needed")
            if meta["least"] is not None and value < meta["least"]:
                raise ValueError(f"model.{f.name}={value!r} must be >= {meta['least']}")
        for name in ("layer_norm_eps", "initializer_range"):  # a norm's division, an init's spread
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be > 0 (the default: "
                                 f"{type(self).__dataclass_fields__[name].default})")
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be in [0, 1)")
        if not (0.0 <= self.attention_output_dropout_rate < 1.0 or self.attention_output_dropout_rate == -1):
            raise ValueError(f"model.attention_output_dropout_rate={self.attention_output_dropout_rate!r} "
                             "must be in [0, 1), or -1 (model.dropout_rate's)")
        if self.rope_theta <= 0 or self.rope_local_theta < 0:
            bad = "rope_theta" if self.rope_theta <= 0 else "rope_local_theta"
            raise ValueError(f"model.{bad}={getattr(self, bad)!r}: rope's base must be > 0 "
                             f"(10000 is the usual; ModernBERT 160000 global, 10000 local)"
                             + (", or 0 for rope_theta" if bad == "rope_local_theta" else ""))
        if self.normalization == "rmsnorm" and self.norm_bias:
            raise ValueError("model.normalization=rmsnorm has no bias: set model.norm_bias=False "
                             "(or model.normalization=layernorm)")

    @property
    def vocab_rows(self) -> int:
        """Rows of the token embedding table (and columns of the output logits)."""
        return self.vocab_size

    @property
    def attention_output_dropout(self) -> float:
        """The dropout rate on the attention sublayers' outputs (-1: dropout_rate's)."""
        rate = self.attention_output_dropout_rate
        return self.dropout_rate if rate == -1 else rate

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the position embeddings cover (None: no limit)."""
        return self.max_len if self.positions == "learned" else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig(ModelConfig):
    """BERT: learned positions (max_len), segment A/B embeddings, post-LN, the MLM head tied to
    the word embeddings; a pooler on the bare encoder by choice, on the heads that need one.
    RoBERTa is this family with position_offset = pad id + 1 and type_vocab_size = 1, ModernBERT
    this family with its switches (models.modernbert_model_fields); hf_family says which."""

    family: ClassVar[str] = "BERT"

    type_vocab_size: int = _field(2, "architecture", least=0)  # segment A/B embeddings; 0 = none
    embedding_norm: bool = _field(True, "architecture")  # a norm after the embeddings (BERT, ModernBERT)
    vocab_multiple: int = _field(1, "architecture", flops=True, least=1)  # table rows padded to a multiple
    # The task heads: bert: a tanh pooler on [CLS] (sentence tasks), the sequence output as is
    # (tokens, spans); modernbert: dense + activation + norm (the MLM head's transform) on the
    # pooled vector or every token, then dropout and the classifier (HF ModernBertFor*).
    task_head: str = _field("bert", "architecture", choices=("bert", "modernbert"))
    pooling: str = _field("cls", "state", choices=("cls", "mean"),  # modernbert heads: [CLS] or the mean
                          only=("bert", "bert_classification", "bert_choice"))
    linformer_k: int = _field(256, "state", flops=True, least=1)  # projected sequence length
    # RoBERTa: a token at position t reads position row t + offset (pad id + 1), padding the
    # pad id's row (HF's create_position_ids_from_input_ids); 0 = BERT.
    position_offset: int = _field(0, "architecture", least=0)
    # The published family whose checkpoints this model reads and writes (bert-jax convert sets
    # it from config.json's model_type; export writes that family's classes). Declared, never
    # guessed from the other fields (models.stored_model_config infers it once for configs saved
    # before it existed).
    hf_family: str = _field("bert", "architecture", choices=HF_FAMILIES)
    use_pooler: bool = _field(True, "state", only=("bert",))  # [CLS] pooler of the bare encoder
    # next-sentence head (and the pooler it reads); False: MLM only (RoBERTa, ModernBERT)
    nsp: bool = _field(True, "state", only=("bert_pretraining",))
    num_labels: int = _field(2, "state", least=1,  # 1 = regression
                             only=("bert_classification", "bert_tagging"))
    # Sentence embeddings (bert_embedding; training/contrastive.py, docs/retrieval.md): the
    # last hidden states pooled over the real tokens, optionally L2-normalised; the contrastive
    # losses compare cosines times a scale, fixed, or learned from this value (learn_scale);
    # matryoshka_dims: the losses also on these leading dimensions of the vectors (Kusupati et
    # al. 2022), each renormalised.
    embedding_pooling: str = _field("mean", "state", choices=("cls", "mean", "max"),
                                    only=("bert_embedding",))
    normalize_embeddings: bool = _field(True, "state", only=("bert_embedding",))
    similarity_scale: float = _field(20.0, "run", only=("bert_embedding",))
    learn_scale: bool = _field(False, "state", only=("bert_embedding",))
    matryoshka_dims: tuple = _field((), "run", only=("bert_embedding",))

    def __post_init__(self):
        super().__post_init__()
        if self.position_offset >= self.max_len:
            raise ValueError(f"model.position_offset={self.position_offset} leaves no position of "
                             f"the max_len={self.max_len} table; it must be < max_len")
        dims = tuple(int(d) for d in (self.matryoshka_dims or ()))  # JSON gives a list
        object.__setattr__(self, "matryoshka_dims", dims)
        if any(not 1 <= d <= self.emb_dim for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"model.matryoshka_dims={list(dims)}: distinct dimensions from 1 to "
                             f"model.emb_dim={self.emb_dim} (e.g. {self.emb_dim}, "
                             f"{self.emb_dim // 2}, {self.emb_dim // 4}); empty: the whole vector only")
        if self.similarity_scale <= 0:
            raise ValueError(f"model.similarity_scale={self.similarity_scale!r} must be > 0 "
                             "(20 is sentence-transformers' default: a temperature of 0.05)")
        if self.pooling == "mean" and self.task_head == "bert":
            raise ValueError("model.pooling=mean pools for model.task_head=modernbert; BERT's tanh "
                             "pooler reads [CLS]: set model.task_head=modernbert or model.pooling=cls")

    @property
    def vocab_rows(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def max_positions(self) -> int | None:
        return self.max_len - self.position_offset if self.positions == "learned" else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderLMConfig(ModelConfig):
    """A decoder-only LM (GPT style): token embeddings with learned or sinusoidal positions."""

    family: ClassVar[str] = "decoder-only"

    tie_output: bool = _field(True, "state")  # output projection = embedding table transposed
    scale_embeddings: bool = _field(False, "state")  # embeddings x sqrt(emb_dim) (paper 3.4)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderDecoderConfig(DecoderLMConfig):
    """The Transformer encoder-decoder (Vaswani et al.)."""

    family: ClassVar[str] = "encoder-decoder"

    num_decoder_layers: int = _field(0, "state", flops=True, least=0)  # 0 = num_layers
    share_embeddings: bool = _field(True, "state")  # source and target share one table


FAMILIES = (ModelConfig, BertConfig, DecoderLMConfig, EncoderDecoderConfig)


def fields_of_kind(kind: str) -> tuple[str, ...]:
    """The fields of every family whose metadata kind is `kind`, core fields first."""
    assert kind in KINDS, kind
    out: dict[str, None] = {}
    for family in FAMILIES:
        out.update((f.name, None) for f in dataclasses.fields(family) if f.metadata["kind"] == kind)
    return tuple(out)
