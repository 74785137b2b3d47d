"""What tests share besides fixtures (fixtures live in conftest.py): the checkout's paths, the
shared data's place, and tokenizer builders and checks. Tests in every folder import it as
`helpers` (pytest puts tests/, the folder of conftest.py, on sys.path)."""

import contextlib
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def shared_data_dir() -> Path:
    """../shared/data beside the checkout, or $BERT_JAX_SHARED_DATA (when set and not empty)."""
    return Path(os.environ.get("BERT_JAX_SHARED_DATA") or REPO.parent / "shared" / "data")


# XLA's CPU backend compiling faster and running slower: without its LLVM optimisations (-O0:
# a third less compile time) and with its older (LLVM IR) fusion emitters instead of the MLIR
# ones (a quarter less CPU for the unit tests of models, interop and training, 415 -> 321
# CPU-s; long trainings 20% slower). The same numbers up to the last bits of a float.
FEW_STEPS_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int, few_steps: bool = False) -> str:
    """XLA_FLAGS for a `bert-jax` process a test starts: `devices` CPU devices; `few_steps`:
    FEW_STEPS_XLA_FLAGS, as the quick tier (a run of a few tiny steps is mostly compiling). Not
    for a run whose losses are compared bitwise with a run in the test's own process (compiled
    with the slow tier's defaults)."""
    return f"--xla_force_host_platform_device_count={devices}" + f" {FEW_STEPS_XLA_FLAGS}" * few_steps


# ModernBERT's special tokens in its order, added at the end of its vocabulary (50280..50284).
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def write_modernbert_tokenizer(lines: list[str], out: Path, vocab_size: int = 1000) -> Path:
    """A ModernBERT-style tokenizer in `out` (no ModernBERT tokenizer is on disk, and no
    network): byte-level BPE trained on `lines` with its GPT-NeoX/OLMo-style specials first,
    BERT's added at the end ([MASK] taking the space before it), the [CLS] A [SEP] B [SEP]
    template, and a tokenizer_config.json naming them as ModernBERT-base's does."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers import models as tokenizer_models

    tok = Tokenizer(tokenizer_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=["|||IP_ADDRESS|||", "<|padding|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                            for t in MODERNBERT_SPECIALS])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"],
        **{f"{t[1:-1].lower()}_token": t for t in MODERNBERT_SPECIALS}}))
    return out


def assert_bpe_equals_hf(ours, hf_tokenizer, texts: list[str], squad_lines: list[str]):
    """Our byte-level BPE tokenizer encodes as HF's (fast) one: the ids of `texts`, a decode,
    the character offsets of 20 SQuAD texts, and 100 SQuAD pair rows cut (longest first) to 96
    and padded (ids, attention mask, token types). Returns our encode_pair of the first pair."""
    import numpy as np

    ref = hf_tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert [ids.tolist() for ids in ours.encode_batch(texts)] == ref
    assert ours.decode(ours.encode(squad_lines[-1])) == squad_lines[-1]
    for text in squad_lines[-20:]:  # character offsets too
        ids, spans = ours.encode_with_offsets(text)
        ref = hf_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        assert (ids.tolist(), spans.tolist()) == (ref["input_ids"], [list(o) for o in ref["offset_mapping"]])
    a, b = squad_lines[:100], squad_lines[-100:]
    rows = ours.encode_pairs(a, b, 96)
    ref = hf_tokenizer(a, b, padding="max_length", truncation=True, max_length=96,
                       return_tensors="np", return_token_type_ids=True)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(rows[key], ref[key], err_msg=key)
    assert rows["attention_mask"].sum(1).min() < 96 < rows["attention_mask"].sum(1).max() + 1
    enc = ours.encode_pair(a[0], b[0])
    assert enc.input_ids == hf_tokenizer(a[0], b[0])["input_ids"]
    return enc


# Imports the layout rules let through because they are made inside a function, once both
# modules are loaded (unit/test_layout.py; unit/training/test_engine.py's cycle check skips them).
LATE_IMPORTS = {
    ("bert_jax/specs.py", "bert_jax.tasks"): "specs.data resolves a data.name the fine-tuning tasks "
                                             "register, whoever calls it first",
    ("bert_jax/specs.py", "bert_jax.data.sources"): "likewise the data sources' names",
    ("bert_jax/config.py", "bert_jax.tasks"):
        "config.finetune_defaults forwards to the tasks' own, for users' config files that call it",
}


def assert_stopped_and_resumed_run_matches(config, tmp_path):
    """config(steps): a run config saving every 3 steps, its lr independent of train.steps.
    Six steps straight through and three then three more (resumed) log the same losses."""
    from bert_jax.training import metrics, train

    c = config(6)
    c.train.update(eval_every=0, eval_steps=1, log_every=1, checkpoint_every=3)
    train.train_and_evaluate(c, str(tmp_path / "full"))
    for steps in (3, 6):  # the second resumes at 3
        c = config(steps)
        c.train.update(eval_every=0, eval_steps=1, log_every=1, checkpoint_every=3)
        train.train_and_evaluate(c, str(tmp_path / "part"))
    losses = [{r["step"]: r["loss"] for r in metrics.read_metrics(tmp_path / run / "metrics.jsonl")
               if "loss" in r} for run in ("full", "part")]
    assert losses[0] == losses[1] and len(losses[0]) == 6


@contextlib.contextmanager
def jax_cache_of_the_test():
    """For a block that points JAX's compilation cache somewhere of its own (compilation_cache.
    setup_compilation_cache): JAX opens its cache once per process, so it is reset before the
    block and after it, and JAX's settings (the session's cache) and the cache watch restored."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    from bert_jax.training import compilation_cache

    keys = ("jax_enable_compilation_cache", "jax_compilation_cache_dir", "jax_compilation_cache_max_size")
    before = {k: getattr(jax.config, k) for k in keys}
    jax.config.update("jax_compilation_cache_max_size", -1)  # an explicit folder's (no eviction)
    jax_cache.reset_cache()
    try:
        yield
    finally:
        compilation_cache._watch(None, False)
        for k, v in before.items():
            jax.config.update(k, v)
        jax_cache.reset_cache()


def compile_new_program(scale: float) -> None:
    """Compiles and runs a program no compilation cache holds yet (one per `scale`)."""
    import jax

    jax.jit(lambda x: x * scale + 1.0)(jax.numpy.ones(3)).block_until_ready()
