"""The commands of the README and of every docs/*.md page, run as written, in order, each
page in one folder as a user's home (in-process, through bert_jax.commands.run as the
installed `bert-jax` script calls it; tests/integration/test_cli.py runs the real script).

What a page leaves to the user is substituted, and only that: `/path/to/...` (the user's
model folders, by small random models of the same layout; GLUE data (MRPC with 160 training
rows) and text, by small real files), `/tmp/` by a folder of the test, `../shared/data/` by
where that data is; `demo_out/corpus` is built as `make demo` builds it, and the demo's run
`demo_out/run` is the pretraining run of docs/pretraining.md (/tmp/bert_text). A page whose
commands use what another page's commands wrote (NEEDS) runs that page first. The README's
tour is drawn from the pages: each of its commands is a command of a docs page and runs
there. Each command must exit 0.
Running the pages is in the slow tier (docs/testing.md); the checks of what they say are quick.
"""

import re
import resource
import shlex
import time

import pytest
from helpers import REPO, shared_data_dir, write_modernbert_tokenizer

from bert_jax.tools import demo

PREFIX = ".venv/bin/bert-jax "
DOCS = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))

# Pages whose commands use what another page's commands wrote.
NEEDS = {
    "docs/checkpoints.md": ("docs/finetuning.md",),  # exports the fine-tuned /tmp/mrpc
    "docs/pictures.md": ("docs/pretraining.md",),  # draws demo_out/run, here /tmp/bert_text
    "docs/modernbert.md": ("docs/pretraining.md",),  # trains with its /tmp/vocab
}
def page_commands(page: str) -> list[str]:
    """Every `.venv/bin/bert-jax ...` command in the page's code blocks, continuation lines
    joined, runs of spaces made one and trailing comments dropped."""
    text = (REPO / page).read_text()
    commands = []
    for block in re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M):
        for command in block.replace("\\\n", " ").splitlines():
            command = " ".join(re.sub(r"\s+#.*$", "", command).split())
            if command.startswith(PREFIX):
                commands.append(command)
    return commands


def readme_commands() -> list[str]:
    return page_commands("README.md")


def test_readme_and_docs_list_the_commands():
    every = [c for page in DOCS for c in page_commands(page)]
    assert len(every) >= 25
    for name in ("train", "eval", "sweep", "vocab", "info", "convert", "export", "features",
                 "translate", "average", "plot", "attention", "plan", "launch"):
        assert any(c.startswith(PREFIX + name + " ") for c in every), name
    tour = readme_commands()
    for name in ("info", "train", "eval", "convert", "export", "sweep", "translate", "plan",
                 "launch", "plot", "attention"):  # one command of each job
        assert any(c.startswith(PREFIX + name + " ") for c in tour), name


def test_the_readme_tour_is_drawn_from_the_docs():
    """Each README command is a docs page's command, so it runs (as written) with that page."""
    every = {c for page in DOCS for c in page_commands(page)}
    missing = [c for c in readme_commands() if c not in every]
    assert not missing, f"README commands in no docs page (add them to one): {missing}"


def test_the_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert [p for p in DOCS if f"]({p})" not in readme] == []
    for page in DOCS:  # links between pages and to pictures point at files
        for target in re.findall(r"\]\(([^)#:]+)\)", (REPO / page).read_text()):
            assert ((REPO / page).parent / target).exists(), f"{page}: {target}"


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory, wordpiece_vocab):
    """A small Hugging Face BertForPreTraining folder, as a user downloads one."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf_bert")
    config = transformers.BertConfig(vocab_size=1500, hidden_size=32, num_hidden_layers=4,
                                     num_attention_heads=2, intermediate_size=64,
                                     architectures=["BertForPreTraining"])
    transformers.BertForPreTraining(config).save_pretrained(folder)
    (folder / "vocab.txt").write_bytes(wordpiece_vocab.read_bytes())
    return folder


@pytest.fixture(scope="module")
def hf_modernbert(tmp_path_factory, english_lines):
    """A small Hugging Face ModernBertForMaskedLM folder with a ModernBERT-style tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = write_modernbert_tokenizer(english_lines, tmp_path_factory.mktemp("hf_modernbert"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=48, local_attention=16, pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        architectures=["ModernBertForMaskedLM"])
    transformers.ModernBertForMaskedLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def small_glue(shared_data, tmp_path_factory):
    """Real MRPC files, the training file cut to its first 160 rows so that the fine-tuning
    and two-trial sweep take seconds (dev and test complete)."""
    folder = tmp_path_factory.mktemp("glue")
    (folder / "MRPC").mkdir()
    source = shared_data / "glue" / "MRPC"
    lines = (source / "train.tsv").read_bytes().splitlines(keepends=True)
    (folder / "MRPC" / "train.tsv").write_bytes(b"".join(lines[:161]))
    for name in ("dev.tsv", "test.tsv"):
        (folder / "MRPC" / name).write_bytes((source / name).read_bytes())
    return folder


@pytest.fixture(scope="module")
def small_minilm(tmp_path_factory, wordpiece_vocab):
    """A sentence-transformers folder laid out as all-MiniLM-L6-v2 is (a BERT, mean pooling,
    Normalize, max_seq_length 256, uncased WordPiece) around a random 2-layer BERT of width 32:
    the published model's 22M parameters made the page's embedding of STS-B dev (3,000
    sentences) a minute of CPU; tests/unit/interop/test_sentence_models.py checks the published
    one against sentence-transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models as st_models  # (sentence-transformers 5 and 6)
    torch.manual_seed(0)
    bert = tmp_path_factory.mktemp("minilm_bert")
    transformers.BertTokenizerFast(vocab_file=str(wordpiece_vocab), do_lower_case=True) \
        .save_pretrained(bert)
    config = transformers.BertConfig(vocab_size=1500, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64)
    transformers.BertModel(config).save_pretrained(bert)
    folder = tmp_path_factory.mktemp("minilm")
    st.SentenceTransformer(modules=[st_models.Transformer(str(bert), max_seq_length=256),
                                    st_models.Pooling(32, pooling_mode="mean"),
                                    st_models.Normalize()], device="cpu").save(str(folder))
    return folder


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of the processes it waited for (a
    sweep's trials): what a command costs on a machine that runs other things beside it."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Home:
    """The user's folder, shared by the pages of this module, and the pages run in it."""

    def __init__(self, path, user_files):
        self.path, self.user_files, self.ran, self.times = path, user_files, set(), []

    def command(self, command: str) -> list[str]:
        """argv after `bert-jax` of a page's command, with what the user provides filled in."""
        command = command.replace("demo_out/run", "/tmp/bert_text")
        command = command.replace("/tmp/", f"{self.path}/tmp/").replace(" configs/", f" {REPO}/configs/")
        command = command.replace("../shared/data/", f"{shared_data_dir()}/")
        for placeholder, path in self.user_files.items():
            command = command.replace(placeholder, str(path))
        return shlex.split(command)[1:]

    def run_page(self, page: str, cli) -> None:
        """The page's commands in order (after the pages it needs), once."""
        if page in self.ran:
            return
        for need in NEEDS.get(page, ()):
            self.run_page(need, cli)
        for command in page_commands(page):
            t0, c0 = time.time(), cpu_seconds()
            code, _, err = cli(self.command(command))
            self.times.append(f"{time.time() - t0:5.1f}s {cpu_seconds() - c0:5.1f} cpu-s  "
                              f"{command[:150]}")
            assert code == 0, f"{page}: {command}\n{err[-3000:]}"
        self.ran.add(page)


@pytest.fixture(scope="module")
def home(tmp_path_factory, small_glue, hf_model, hf_modernbert, small_minilm, english_lines):
    path = tmp_path_factory.mktemp("home")
    lines = [english_lines[0], f"{english_lines[1]} ||| {english_lines[2]}"]
    (path / "sentences.txt").write_text("\n".join(lines) + "\n")
    demo.build_corpus(path / "demo_out" / "corpus")
    (path / "tmp").mkdir()
    user_files = {  # what the pages say the user provides
        "/path/to/bert-base-uncased": hf_model, "/path/to/bert-base-cased": hf_model,
        "/path/to/ModernBERT-base": hf_modernbert,
        "/path/to/uncased_L-12_H-768_A-12": REPO / "tests/fixtures/tf_bert_tiny",
        "/path/to/glue": small_glue, "/path/to/sentences.txt": path / "sentences.txt",
        "/path/to/all-MiniLM-L6-v2": small_minilm,
    }
    return Home(path, user_files)


@pytest.mark.slow  # each page trains, converts or compiles: 10 s to minutes a page
@pytest.mark.parametrize("page", [p for p in DOCS if page_commands(p)])
def test_docs_commands_run_as_written(page, home, cli, monkeypatch):
    monkeypatch.chdir(home.path)  # relative paths (demo_out/, runs/) as from the user's folder
    try:
        home.run_page(page, cli)
    finally:  # each command's wall and CPU time (pytest -s shows them)
        print("\n".join(home.times))
        home.times.clear()
