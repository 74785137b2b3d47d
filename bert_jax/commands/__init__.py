"""The `bert-jax` command line: one table of commands (COMMANDS, a Command record each: its
name, its function, the flags it reads, its usage lines, whether it compiles a model) and the
entry point (run) that parses the flags, loads --config with its overrides and dispatches
through the table. The functions live by area: training (train, eval, average), sweep (its
trials as processes), data (vocab, prepare), cloud (info, plan, launch), interop (convert,
export, features, embed, mine, eval-embeddings), translate, viz (plot, attention); the flags they
share in options. Adding a command is its function in one of those modules and one record
here. It may import every part of the library (each command imports its modules when it runs,
so a command does not pay for the others' imports); only the tools and the entry points
(main, sweep, __main__) import it.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
import time
from collections.abc import Callable

from absl import app, flags, logging

from bert_jax import config as config_lib
from bert_jax import paths, specs
from bert_jax.commands import cloud, data, interop, options, peers, sweep, training, translate, viz


@dataclasses.dataclass(frozen=True)
class Command:
    """`bert-jax <name>`: `run(args after the name)`, whose docstring is its help."""

    name: str
    run: Callable[[list[str]], None]
    flags: tuple[str, ...]  # the flags it reads, for `bert-jax <name> --help`
    usage: tuple[str, ...]  # its usage lines, for --help
    compiles: bool = False  # compiles a model: uses the persistent compilation cache
    # The path flags it writes to, each with the file extensions it writes there and what any
    # other name is: "folder", "file" or "" (paths.output_kind, then paths.check_output).
    writes: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    # The path flags it reads that must be of a kind (paths.path_kind): each with the kinds it
    # takes ("folder": one of no kind known, which the reader itself judges) and their words.
    reads: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    # Flags it reads only in some combinations: (flag, where it is read, whether this run is one).
    read_only: tuple[tuple[str, str, Callable[[], bool]], ...] = ()


def _given(*names: str) -> Callable[[], bool]:
    """Whether any of these flags has a value (a read_only condition)."""
    return lambda: any(flags.FLAGS[name].value for name in names)


# A checkpoint read (--checkpoint, a run's --workdir): a step folder, a sweep's, a
# sentence-transformers or Hugging Face folder given instead is named with the way to one.
CHECKPOINT = ("checkpoint", ("run", "folder"), "a checkpoint (a training run's folder or a "
              "`bert-jax convert` output)")
RUN = ("workdir", ("run", "folder"), "a training run's folder")
# JSON-lines outputs (features, mine): named .jsonl, or .json as they were before the names
# were checked (the file is JSON lines either way)
JSON_LINES = (".jsonl", ".json")
FIGURES = (".png", ".svg", ".pdf")  # plot's and attention's figure files (viz/plots.FORMATS)


def _into_shards() -> bool:
    """embed --output is a folder of shards (not a .npy array)."""
    return not str(flags.FLAGS["output"].value or "").endswith(".npy")


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("train", training.cmd_train, ("config", "workdir", "compilation_cache",
        "compilation_cache_required"), (
        "bert-jax train --config configs/bert_pretrain.py:tiny --workdir <dir> "
        "[--config.train.steps=100]",), compiles=True, writes=(("workdir", (), "folder"),)),
    Command("eval", training.cmd_eval, ("workdir", "config", "step", "split", "compilation_cache",
        "compilation_cache_required"), (
        "bert-jax eval --workdir <dir> [--config <file>] [--step latest|best|all|N]",
        "             [--split dev|test|<file>]   (fine-tuning: <dir>/eval/step_N/, other splits "
        "<dir>/eval/<split>/)"), compiles=True,
        reads=(("workdir", RUN[1], "a training run's folder (its checkpoints/ are evaluated)"),)),
    Command("sweep", sweep.cmd_sweep, ("config", "workdir", "print_commands"), (
        "bert-jax sweep --config configs/sweeps/glue.py:mrpc --workdir <dir> [--print_commands]",),
        writes=(("workdir", (), "folder"),)),
    Command("vocab", data.cmd_vocab, ("input", "size", "type", "sp_model_type", "lowercase", "out"), (
        "bert-jax vocab --input 'books/*.txt' --size 8192 --type wordpiece --out <dir>",),
        writes=(("out", (), "folder"),)),
    Command("prepare", data.cmd_prepare, ("config", "out"), (
        "bert-jax prepare --config configs/bert_pretrain.py:base --out <dir>   (array_record shards)",),
        writes=(("out", (), "folder"),)),
    Command("info", cloud.cmd_info, ("config", "seq_len"), (
        "bert-jax info --config configs/bert_pretrain.py:base [--config.dtype=bfloat16]",)),
    Command("plan", cloud.cmd_plan, ("config", "topology", "slices", "mfu", "json"), (
        "bert-jax plan --config configs/bert_pretrain.py:base --topology v3-32 [--slices 2] [--json]",)),
    Command("launch", cloud.cmd_launch, (
        "config", "workdir", "topology", "name", "zone", "any_zone", "project", "runtime_version",
        "spot", "keep", "dry_run", "max_restarts", "repo", "commit", "skip_plan", "poll_seconds",
        "python"), (
        "bert-jax launch --config configs/bert_pretrain.py:base --topology v3-32 --workdir gs://B/run",
        "             --name bert-base --zone europe-west4-a [--spot] [--keep] [--dry_run]")),
    Command("convert", interop.cmd_convert, ("head",), (
        "bert-jax convert hf:<hf_dir>|tf:<tf_checkpoint> <out_dir> [--head bert_classification]",
        "bert-jax convert st:<sentence_transformers_dir> <out_dir>   (with its pooling)")),
    Command("export", interop.cmd_export, ("step",), (
        "bert-jax export <checkpoint_dir> hf:<out_dir> [--step N]   (a Hugging Face folder for "
        "transformers)",
        "bert-jax export <checkpoint_dir> st:<out_dir>   (a sentence-transformers folder)")),
    Command("embed", interop.cmd_embed, (
        "checkpoint", "input", "output", "pooling", "batch_size", "shard_size",
        "compilation_cache", "compilation_cache_required"), (
        "bert-jax embed --checkpoint <dir> --input <txt> --output <npy>   (a vector per line)",
        "bert-jax embed --checkpoint <dir> --input <txt|jsonl> --output <folder> [--shard_size N]",
        "             (shards of vectors with their ids; run again to resume)"),
        compiles=True, writes=(("output", (".npy",), "folder"),),
        read_only=(("shard_size", "with a folder as --output (a .npy is one array)", _into_shards),),
        reads=(CHECKPOINT,)),
    Command("mine", interop.cmd_mine, (
        "checkpoint", "input", "output", "negatives", "corpus", "batch_size", "compilation_cache",
        "compilation_cache_required"), (
        "bert-jax mine --checkpoint <dir> --input <pair file> --output <jsonl> [--negatives 5] "
        "[--corpus <txt>]",), compiles=True, writes=(("output", JSON_LINES, "file"),), reads=(CHECKPOINT,)),
    Command("eval-embeddings", interop.cmd_eval_embeddings, (
        "checkpoint", "sts", "beir", "split", "squad", "bm25", "pooling", "bootstrap", "batch_size",
        "compilation_cache", "compilation_cache_required"), (
        "bert-jax eval-embeddings --checkpoint <dir> [--sts <STS-B tsv>] [--beir <folder> "
        "[--split test]] [--squad <json>] [--bm25]",
        "bert-jax eval-embeddings --bm25 --squad <json>   (BM25's retrieval scores alone)"),
        compiles=True, read_only=(
            ("split", "with --beir (the qrels file it names)", _given("beir")),
            ("bm25", "with --beir or --squad (BM25 ranks retrieval sets, not --sts pairs)",
             _given("beir", "squad")),
            *((name, "with --checkpoint (BM25 alone encodes nothing)", _given("checkpoint"))
              for name in ("pooling", "batch_size"))),
        reads=(CHECKPOINT, ("beir", ("beir", "folder"), "a BEIR folder (corpus.jsonl, queries.jsonl, "
                                                        "qrels/<split>.tsv)"))),
    Command("features", interop.cmd_features, (
        "checkpoint", "input", "output", "layers", "max_seq_length", "batch_size",
        "compilation_cache", "compilation_cache_required"), (
        "bert-jax features --checkpoint <dir> --input <txt> --output <jsonl> [--layers -1,-2,-3,-4]",),
        compiles=True, writes=(("output", JSON_LINES, "file"),), reads=(CHECKPOINT,)),
    Command("translate", translate.cmd_translate, (
        "checkpoint", "input", "output", "beam", "alpha", "reference", "batch_size",
        "compilation_cache", "compilation_cache_required"), (
        "bert-jax translate --checkpoint <dir> --input <txt> --output <txt> [--beam 4 --alpha 0.6]",
        "             [--reference <txt>]   (prints sacreBLEU against the reference)"), compiles=True,
        writes=(("output", (".txt",), "file"),), reads=(CHECKPOINT,)),
    Command("average", training.cmd_average, ("workdir", "last", "out"), (
        "bert-jax average --workdir <dir> --last 5 --out <dir>   (a checkpoint of the mean weights)",),
        writes=(("out", (), "folder"),), reads=(RUN,)),
    Command("plot", viz.cmd_plot, ("workdir", "out", "x", "smoothing"), (
        "bert-jax plot --workdir <dir> [<dir> ...] [--out curves.png|.svg] [--x step|time|tokens]",
        "             [--smoothing 0.6]   (default out: <first dir>/plots/metrics.png, data in .csv "
        "beside)"), writes=(("out", FIGURES, ""),), reads=(RUN,)),
    Command("attention", viz.cmd_attention, (
        "checkpoint", "text", "pair", "out", "layer", "head_index", "step", "max_seq_length",
        "compilation_cache", "compilation_cache_required"), (
        "bert-jax attention --checkpoint <dir> --text \"...\" [--pair \"...\"] [--out a.png|a.html]",
        "             [--layer -1 --head_index 0]   (default: <dir>/plots/attention.png and .html;",
        "             data in .json)"), compiles=True, writes=(("out", (*FIGURES, ".html"), ""),),
        reads=(CHECKPOINT,)),
)}
HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")


def main(argv: list[str]) -> None:
    """Runs the command `argv[1]` (flags already parsed): a bad flag or argument is one line and
    exit 2, bad input or storage one line and exit 1."""
    if not flags.FLAGS["verbosity"].present:  # libraries' INFO lines (Orbax: dozens a save) off
        logging.set_verbosity(logging.WARNING)
    from bert_jax import log

    log.configure()  # our progress lines (INFO) on stdout, warnings on stderr
    log.divert_library_errors()  # a failed save's hundreds of Orbax lines: to a file
    try:
        command = COMMANDS.get(argv[1]) if len(argv) > 1 else None
        if command is None:
            got = f"unknown command {argv[1]!r}; " if len(argv) > 1 else ""
            raise app.UsageError(f"{got}usage: bert-jax <command> [flags]; commands: "
                                 f"{', '.join(COMMANDS)}")
        check_flags_read(command)
        check_path_flags(command)
        check_flag_ranges(command)
        if command.compiles:
            from bert_jax.training.compilation_cache import setup_compilation_cache

            setup_compilation_cache(options.COMPILATION_CACHE.value, command.name,
                                    options.WORKDIR.value, options.COMPILATION_CACHE_REQUIRED.value)
        command.run(argv[2:])
        peers.finished()  # (a multi-process run: this process's end is not a fault)
    except app.UsageError as e:  # a missing or malformed flag or argument
        _bad_flag(str(e))
    except KeyboardInterrupt:  # Ctrl-C (a training loop saves first: train.Preemption)
        print(f"bert-jax {argv[1]}: interrupted", file=sys.stderr)
        sys.exit(130)
    except (ValueError, OSError, config_lib.MissingExtra) as e:  # bad input, storage, an uninstalled
        # extra: one line, not a traceback
        print(f"bert-jax {argv[1]}: error: {_one_line(_named(e, command))}", file=sys.stderr)
        sys.exit(1)


# The flags that name a file or folder (local or gs://), checked as one before any command runs.
PATH_FLAGS = ("workdir", "checkpoint", "input", "output", "reference", "out", "compilation_cache",
              "corpus", "sts", "beir", "squad")

# What to do about an OS error on a path the user gave, by its errno.
_OS_ADVICE = {errno.ENOENT: "check the path", errno.EISDIR: "a folder where a file is needed",
              errno.ENOTDIR: "a file where a folder is needed", errno.EACCES: "not readable by you",
              errno.EEXIST: "already there; choose a path that is not",
              errno.EPERM: "the system does not allow it there (a file or folder marked immutable, "
                           "or a security policy); choose another path",
              errno.EROFS: "a read-only file system; choose a folder on a writable one"}
# ... where the path is one the command writes (--out, --output, its `writes`), or any other path
_WRITE_ADVICE = {errno.EACCES: "not writable by you; choose a folder you can write to, or change "
                               "its permissions"}
_ANY_ADVICE = {errno.EACCES: "not readable or not writable by you; check its permissions"}
_READ_FLAGS = ("input", "reference", "corpus", "sts", "beir", "squad")  # read, never written


def _named(error: BaseException, command: Command | None) -> BaseException | str:
    """An OS error as the OS words it ("[Errno 2] No such file or directory: 'x'") as a line
    naming the flag whose path it is, the file and what to do; any other error as it is."""
    if not (isinstance(error, OSError) and error.filename and error.strerror
            and str(error).startswith("[Errno")):
        return error
    file = os.fspath(error.filename)
    given = [(name, str(flags.FLAGS[name].value)) for name in (command.flags if command else ())
             if name in PATH_FLAGS and flags.FLAGS[name].value]
    # the flag whose path holds the file most closely (--out inside --workdir: --out)
    name, value = max(((name, value) for name, value in given
                       if file == value or file.startswith(value.rstrip("/") + "/")),
                      key=lambda nv: (nv[1] == file, len(nv[1])), default=(None, None))
    flag = f"{file}: " if name is None else f"--{name}={value}: " + ("" if file == value else f"{file}: ")
    # else an argument's path, one the command chose, a run's or a checkpoint's files (read and
    # written: a resume, plots beside a checkpoint)
    by_use = (_WRITE_ADVICE if name in ("out", "output", *(w for w, *_ in command.writes))
              else {} if name in _READ_FLAGS else _ANY_ADVICE)
    advice = by_use.get(error.errno, _OS_ADVICE.get(error.errno))
    return f"{flag}{error.strerror.lower()}" + (f" ({advice})" if advice else "")


def _knows_timeout_flag() -> bool:
    """Whether the installed jaxlib's XLA has COLLECTIVE_TIMEOUT_FLAG (XLA refuses to start on a
    flag it does not know): checked in jaxlib 0.10; older ones are left at XLA's 40 s."""
    from importlib import metadata
    try:
        return tuple(int(p) for p in metadata.version("jaxlib").split(".")[:2]) >= (0, 10)
    except (metadata.PackageNotFoundError, ValueError):
        return False


def check_flags_read(command: Command) -> None:
    """A bert_jax flag given on the command line that `command` does not read would do nothing
    (`plot --output x.png` writing to the default place): a bad flag naming the command's own;
    so would one it reads only with other flags (its read_only), given without them."""
    given = sorted(f.name for f in flags.FLAGS.flags_by_module_dict().get(options.__name__, ())
                   if f.present and f.name not in command.flags)
    if given:
        raise app.UsageError(
            f"--{given[0]} is not a flag of `{command.name}` (it would do nothing); its flags: "
            + ", ".join(f"--{name}" for name in command.flags) + f" (bert-jax {command.name} --help)")
    for name, where, read in command.read_only:  # ... nor one this combination does not read
        if flags.FLAGS[name].present and not read():
            raise app.UsageError(f"--{name}: `{command.name}` reads it only {where}, so here it "
                                 "would do nothing; drop it")


def check_path_flags(command: Command) -> None:
    """Each path flag `command` reads, as given (paths.check_given; --compilation_cache's auto
    and off are not paths): a bad one is a bad flag. Then each one it writes: a file where a
    folder must be, or the reverse (paths.check_output), is an error found on the disk."""
    for name in command.flags:
        value = flags.FLAGS[name].value if name in PATH_FLAGS else None
        if value is not None and not (name == "compilation_cache" and value in ("auto", "off")):
            try:
                if name == "compilation_cache":  # OFF, none, 0: not folders
                    specs.folder_or_keyword(value, ("auto", "off"), "--compilation_cache")
                paths.check_given(value, f"--{name}")
            except ValueError as e:
                raise app.UsageError(str(e)) from None
    for name, kinds, give in command.reads:
        value = flags.FLAGS[name].value
        if value and (wrong := paths.wrong_kind(value, f"--{name}", kinds, give,
                                                step_flag="step" in command.flags)):
            raise ValueError(wrong)
    for name, files, other in command.writes:
        if flags.FLAGS[name].value is not None:
            value = flags.FLAGS[name].value
            kind = paths.output_kind(value, f"--{name}", command.name, files, other)
            paths.check_output(value, f"--{name}", kind)


# The least value of each count flag (a flag read by several commands means the same in each)
# that no library function checks itself (--beam, --last, --slices, --max_restarts: their
# owners do, for callers of the API too).
FLAG_LEAST = {"batch_size": 1, "shard_size": 1, "negatives": 1, "bootstrap": 40}
# Why a least value is above 1, said with the refusal.
FLAG_WHY = {"bootstrap": ": a 95% interval's bounds are the 2.5% and 97.5% percentiles of the "
            "resamples, and fewer than 40 leave no resample beyond them (1000 is the default)"}


def check_flag_ranges(command: Command) -> None:
    """Each count flag `command` reads within its range (FLAG_LEAST), before any work: a value
    out of range is an error naming it, never replaced by the default or left to fail later."""
    for name in command.flags:
        value = flags.FLAGS[name].value if name in FLAG_LEAST else None
        if value is not None and value < FLAG_LEAST[name]:
            raise ValueError(f"--{name}={value} must be >= {FLAG_LEAST[name]}{FLAG_WHY.get(name, '')}")


def _one_line(error: BaseException) -> str:
    """The error's message on one line (a library's message may span several)."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


# The flags that read several values as one comma-separated list, and the commands that do.
LIST_FLAGS = {"workdir": ("plot",), "layers": ("features",), "input": ("vocab",)}


def check_flags_once() -> None:
    """A bert_jax flag given twice (`plot --workdir A --workdir B`, `--spot --nospot`): absl
    keeps the last and drops the other without a word, so it is a bad flag naming it (with the
    list form where a command reads several values)."""
    for flag in flags.FLAGS.flags_by_module_dict().get(options.__name__, ()):
        if flag.present > 1:
            several = LIST_FLAGS.get(flag.name)
            raise app.UsageError(
                f"--{flag.name} is given {flag.present} times: the last would silently replace the "
                "others; give it once" + (f" (several values as one comma-separated list, "
                f"--{flag.name} A,B, for {', '.join(several)})" if several else ""))


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without them, the --config.<key>=<value> overrides); `--config.key value` too."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            key_value = arg[len("--config."):]
            if "=" not in key_value and i + 1 < len(argv):
                key_value, i = f"{key_value}={argv[i + 1]}", i + 1
            overrides.append(key_value)
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def _bad_flag(message) -> None:
    print(f"bert-jax: bad flag: {_one_line(message)} (`bert-jax --help` lists the commands and "
          "flags)", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl flags, then --config loaded with its overrides by our loader (whose errors name the
    file, the key and the valid choices): one clear line and exit 2 for anything bad."""
    rest, overrides = _split_overrides(argv)
    try:
        remaining = flags.FLAGS(rest)
    except flags.Error as e:
        _bad_flag(str(e))
    try:
        check_flags_once()
    except app.UsageError as e:
        _bad_flag(str(e))
    # (a later override replacing a base command's is how scripts and tests vary one value)
    if repeated := config_lib.repeated_override(overrides):
        print(f"warning: {repeated}; give it once", file=sys.stderr)
    if options.CONFIG.value is not None:
        try:
            options.LoadedConfig.value = config_lib.load(options.CONFIG.value, overrides)
        except Exception as e:  # noqa: BLE001 (a config file can raise anything; say which file)
            _bad_flag(e if isinstance(e, config_lib.ConfigError) else f"--config="
                      f"{options.CONFIG.value}: {type(e).__name__}: {e}")
        options.LoadedConfig.overrides = tuple(overrides)
    elif overrides:
        _bad_flag(f"--config.{overrides[0]} needs --config=<file.py[:arg]> to apply to")
    return remaining


def print_help(command: str | None) -> None:
    """`bert-jax --help` (every command) or `bert-jax <command> --help` (its usage and flags)."""
    if command not in COMMANDS:
        print("usage: bert-jax <command> [flags]   (`bert-jax <command> --help` for its flags)\n")
        for c in COMMANDS.values():
            print(f"  {c.name:<9} {' '.join((c.run.__doc__ or '').split()).split(';')[0]}")
        print("\n" + "\n".join(f"  {line}" for c in COMMANDS.values() for line in c.usage))
        return
    c = COMMANDS[command]
    print("usage:\n" + "\n".join(f"  {line}" for line in c.usage))
    print((c.run.__doc__ or "").strip() + "\n\nflags:")
    for name in c.flags:
        flag = flags.FLAGS[name]
        default = "" if flag.default is None else f" (default: {flag.default})"
        print(f"  --{name}: {flag.help}{default}")


# XLA's CPU collectives abort the process (SIGABRT: "Termination timeout for `all gather` ...
# of 40 seconds exceeded") when the devices' threads do not all reach a collective within 20 s
# (a warning) + 40 s.
SIMULATED_DEVICES_FLAG = "--xla_force_host_platform_device_count"
COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
SIMULATED_COLLECTIVE_TIMEOUT_S = 600


def setup_process() -> None:
    """What a bert_jax process sets up once, before JAX starts: the console log handler,
    libtpu told that there is no TPU when it is installed on a machine without one, and
    patient collectives for simulated CPU devices (patient_simulated_devices)."""
    from bert_jax import log
    from bert_jax.cloud import tpu

    log.install()
    tpu.quiet_libtpu_off_tpu()
    patient_simulated_devices()


def patient_simulated_devices() -> None:
    """Simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N, as the tests
    and the docs' multi-device examples use) are N threads sharing the machine's cores: on a
    loaded machine one can reach a collective more than 40 s after the others, and XLA's CPU
    backend then aborts the process. With simulated devices, and unless XLA_FLAGS sets it, that
    limit is raised to SIMULATED_COLLECTIVE_TIMEOUT_S (a real deadlock still ends). Call
    before JAX creates its CPU client (XLA reads XLA_FLAGS then)."""
    xla_flags = os.environ.get("XLA_FLAGS", "")
    if (SIMULATED_DEVICES_FLAG in xla_flags and COLLECTIVE_TIMEOUT_FLAG not in xla_flags
            and _knows_timeout_flag()):
        os.environ["XLA_FLAGS"] = (f"{xla_flags} {COLLECTIVE_TIMEOUT_FLAG}="
                                   f"{SIMULATED_COLLECTIVE_TIMEOUT_S}").strip()


def run() -> None:
    """Console-script entry point."""
    options.Started.at = time.time()
    setup_process()
    try:
        if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
            print_help(sys.argv[1] if len(sys.argv) > 1 else None)
            sys.exit(0)
        app.run(main, flags_parser=_parse_flags)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
