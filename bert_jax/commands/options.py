"""The flags of every command (one absl set: a flag such as --config or --workdir is read by
several commands), the loaded --config and what the commands share to read them."""

from __future__ import annotations

from absl import app, flags

CONFIG = flags.DEFINE_string("config", None, "train, eval, sweep, prepare, info, plan, launch: a "
                             "get_config(arg) file, path.py[:arg]; then --config.<key>=<value> "
                             "overrides")
HEAD = flags.DEFINE_string("head", None, "convert: our model name for the converted weights "
                           "(default: from the checkpoint's architectures)")
WORKDIR = flags.DEFINE_string("workdir", None, "train, eval, sweep, launch, average, plot: the "
                              "run directory (local or gs://; rerunning train resumes it)")
CHECKPOINT = flags.DEFINE_string("checkpoint", None, "features, embed, mine, eval-embeddings, "
                                 "translate, attention: converted, averaged or training dir")
INPUT = flags.DEFINE_string("input", None, "features: text file, one line per example "
                            "(`A ||| B` for pairs); embed: one sentence per line (into a folder: "
                            "or a BEIR corpus.jsonl); mine: a pair file (docs/retrieval.md); "
                            "translate: source sentences, one per line")
OUTPUT = flags.DEFINE_string("output", None, "features: output JSON-lines file; embed: .npy "
                             "file of the vectors, or a folder of shards with their ids; mine: "
                             "the pairs with their negatives (JSON lines); translate: output "
                             "text file (one translation per input line)")
BEAM = flags.DEFINE_integer("beam", None, "translate: beam size, 1 = greedy (default: the "
                            "run config's decode.beam_size)")
ALPHA = flags.DEFINE_float("alpha", None, "translate: length penalty alpha (default: "
                           "decode.alpha of the run config)")
REFERENCE = flags.DEFINE_string("reference", None, "translate: reference translations; prints "
                                "sacreBLEU and the paper's tokenized BLEU")
LAST = flags.DEFINE_integer("last", 5, "average: number of newest checkpoints to average")
LAYERS = flags.DEFINE_string("layers", "-1,-2,-3,-4", "features: encoder layers to output")
MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "features, attention: tokens per "
                                      "example (at most)")
BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "features: examples per batch (default "
                                  "8); embed, eval-embeddings: sentences per batch (default 32); translate: "
                                  "sentences per batch (default decode.batch_size)")
SEQ_LEN = flags.DEFINE_integer("seq_len", None, "info: sequence length for FLOPs "
                               "(default: config.data.max_seq_length)")
OUT = flags.DEFINE_string("out", None, "vocab, prepare, average: output directory; plot, "
                          "attention: output file (.png, .svg, .pdf; attention also .html)")
X = flags.DEFINE_enum("x", "step", ["step", "time", "tokens"], "plot: the x axis (wall time in "
                      "hours, or real tokens seen)")
SMOOTHING = flags.DEFINE_float("smoothing", 0.6, "plot: exponential smoothing weight of train "
                               "curves, as TensorBoard's (0 = raw only)")
TEXT = flags.DEFINE_string("text", None, "attention: the input sentence (an encoder-decoder "
                           "translates it)")
PAIR = flags.DEFINE_string("pair", None, "attention: a second sentence (BERT: segment B)")
LAYER = flags.DEFINE_integer("layer", -1, "attention: the layer of the large heatmap")
HEAD_INDEX = flags.DEFINE_integer("head_index", 0, "attention: the head of the large heatmap")
SIZE = flags.DEFINE_integer("size", 30522, "vocab: vocabulary size (at most)")
TYPE = flags.DEFINE_enum("type", "wordpiece", ["wordpiece", "sentencepiece"], "vocab: kind")
SP_MODEL = flags.DEFINE_enum("sp_model_type", "unigram", ["unigram", "bpe"],
                             "vocab: SentencePiece algorithm")
LOWERCASE = flags.DEFINE_boolean("lowercase", True, "vocab: lowercase (uncased) vocabulary")
STEP = flags.DEFINE_string("step", "latest", "eval: latest, best, all or a checkpoint step; "
                           "export, attention: latest or a step")
SPLIT = flags.DEFINE_string("split", None, "eval (fine-tuning): dev (default), test, or a file "
                            "path; eval-embeddings: the BEIR qrels split (default test)")
STS = flags.DEFINE_string("sts", None, "eval-embeddings: a GLUE STS-B tsv with scores (e.g. dev.tsv)")
BEIR = flags.DEFINE_string("beir", None, "eval-embeddings: a BEIR folder (corpus.jsonl, "
                           "queries.jsonl, qrels/<split>.tsv)")
SQUAD = flags.DEFINE_string("squad", None, "eval-embeddings: a SQuAD json file as retrieval (a "
                            "question retrieves its paragraph)")
NEGATIVES = flags.DEFINE_integer("negatives", 5, "mine: hard negatives written per query")
SHARD_SIZE = flags.DEFINE_integer("shard_size", 10_000, "embed into a folder: rows per shard "
                                  "file (a resumed run re-embeds at most the shards not written)")
CORPUS = flags.DEFINE_string("corpus", None, "mine: the passages to mine from, one per line "
                             "(default: every positive and negative of the --input pair file)")
POOLING = flags.DEFINE_enum("pooling", None, ["cls", "mean", "max"], "embed, eval-embeddings: "
                            "pool the last hidden states this way instead of as the checkpoint "
                            "says (a pretraining checkpoint: the [CLS] vector)")
BM25 = flags.DEFINE_boolean("bm25", False, "eval-embeddings: also rank the retrieval sets by "
                            "BM25 (the bm25s package; without --checkpoint: BM25 only)")
BOOTSTRAP = flags.DEFINE_integer("bootstrap", 1000, "eval-embeddings: resamples of the 95% "
                                 "confidence intervals (seeded; at least 40)")
TOPOLOGY = flags.DEFINE_string("topology", None, "plan: a Cloud TPU slice, e.g. v3-32, v4-32, "
                               "v5p-64, v5litepod-16, v6e-16")
SLICES = flags.DEFINE_integer("slices", 1, "plan: number of such slices (multislice)")
MFU = flags.DEFINE_float("mfu", 0.4, "plan: model FLOPs utilisation for the projected time")
JSON = flags.DEFINE_boolean("json", False, "plan: print JSON (for scripts) instead of a table")
NAME = flags.DEFINE_string("name", None, "launch: name of the queued resource and TPU VM")
ZONE = flags.DEFINE_string("zone", None, "launch: Cloud zone, e.g. us-central2-b")
ANY_ZONE = flags.DEFINE_boolean("any_zone", False, "launch: accept a --zone missing from "
                                "bert_jax's table of TPU zones (one Google added since)")
PROJECT = flags.DEFINE_string("project", None, "launch: Cloud project (default: gcloud's)")
RUNTIME = flags.DEFINE_string("runtime_version", None, "launch: TPU VM software version "
                              "(default: by generation, e.g. tpu-ubuntu2204-base for v4)")
SPOT = flags.DEFINE_boolean("spot", False, "launch: spot capacity (cheaper, preemptible)")
KEEP = flags.DEFINE_boolean("keep", False, "launch: keep the slice at the end (default: delete)")
DRY_RUN = flags.DEFINE_boolean("dry_run", False, "launch: print every gcloud command, run none")
MAX_RESTARTS = flags.DEFINE_integer("max_restarts", 3, "launch: re-requests after preemption")
REPO = flags.DEFINE_string("repo", None, "launch: git URL the workers clone (default: origin)")
COMMIT = flags.DEFINE_string("commit", None, "launch: commit the workers run (default: HEAD)")
SKIP_PLAN = flags.DEFINE_boolean("skip_plan", False, "launch: do not compile the plan first "
                                 "(where libtpu cannot be installed)")
POLL = flags.DEFINE_float("poll_seconds", 30.0, "launch: seconds between state checks")
PYTHON = flags.DEFINE_string("python", None, "launch: the workers' Python, major.minor (default: "
                             "this machine's; uv provides it where the image's python3 differs)")
COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", "auto", "train, eval, translate, features, attention: JAX's persistent "
    "cache of compiled programs, so a restart loads them instead of compiling again: auto (the "
    "gs:// --workdir's compilation_cache/ folder, else ~/.cache/bert_jax/jit; "
    "$JAX_COMPILATION_CACHE_DIR if set), off, or a directory (local or gs://)")
COMPILATION_CACHE_REQUIRED = flags.DEFINE_boolean(
    "compilation_cache_required", False, "with --compilation_cache: a cache that cannot be used "
    "(unreachable, not writable, full) stops the command before it starts, and one that fails "
    "while it runs stops it then, rather than the command running without a cache after one "
    "warning line")
PRINT_COMMANDS = flags.DEFINE_boolean("print_commands", False, "sweep: print one `bert-jax train` "
                                      "command per trial (for a cluster scheduler) instead of running")


class Started:
    """When the command started (unix time): a training job's wall time (goodput) begins here."""

    at: float | None = None


class LoadedConfig:
    """The --config file with its --config.<key>=<value> overrides, loaded when flags are parsed."""

    value = None  # ml_collections.ConfigDict, or None without --config
    overrides: tuple[str, ...] = ()  # "key=value" as typed

    @classmethod
    def set_by_user(cls) -> set[str]:
        return {o.partition("=")[0] for o in cls.overrides}

    @classmethod
    def reset(cls) -> None:
        """As a new process has it (tests run several commands in one process)."""
        cls.value, cls.overrides = None, ()


def require(flag, command: str):
    """The flag's value (--config: the loaded config); a usage error if it is not given."""
    value = LoadedConfig.value if flag.name == "config" else flag.value
    if value is None:
        raise app.UsageError(f"`bert-jax {command}` needs --{flag.name}")
    return value


def list_items(flag: str, values: list[str], item=str, same=None) -> list:
    """The items of a comma-separated list flag (`flag`: its name with --; `values`: its value
    and any arguments listing more), each parsed by `item`: an empty item (`a,,b`, `a,`) or an
    item named twice (by `same`'s key, e.g. the file it names) is a UsageError naming it, as
    it would be read twice or silently dropped."""
    seen: dict = {}
    for value in values:
        if not value.strip():
            raise app.UsageError(f"{flag} is empty; give one or more items separated by commas")
        for part in value.split(","):
            if not part.strip():
                raise app.UsageError(f"{flag}={value!r}: an empty item (two commas, or one at an "
                                     "end); list each item once, separated by single commas")
            key = (same or (lambda v: v))(item(part.strip()))
            if key in seen:
                raise app.UsageError(f"{flag}={value!r}: {seen[key]} is named twice"
                                     + (f" (again as {part.strip()})" if part.strip() != seen[key] else "")
                                     + "; list each item once")
            seen[key] = part.strip()
    return [item(p) for p in seen.values()]


def maybe_initialize_distributed(command: str) -> None:
    """jax.distributed.initialize() when launched as one of several processes: Cloud TPU pod
    slices, SLURM, or JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID set by hand.
    Then the processes watch each other (peers.watch): a lost one stops the rest, naming it."""
    import os

    import jax

    from bert_jax.commands import peers

    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"],
                                   int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"]))
    elif int(env.get("SLURM_NTASKS", "1")) > 1 or "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        jax.distributed.initialize()  # auto-detected from the cluster environment
    else:
        return
    peers.watch(command)
