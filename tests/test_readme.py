"""The README's commands, run as written (one process each, as a user types them), in order.

What the README leaves to the user is substituted, and only that: `/path/to/...` (the
user's model folders, GLUE data (MRPC with 160 training rows), text) by small real files,
`/tmp/` by a fresh folder, `../shared/data/` by where that data is (commands run elsewhere);
`demo_out/corpus` is built as `make demo` builds it, and the demo's run `demo_out/run` is the
README's own pretraining run of that corpus (/tmp/bert_text, trained by an earlier command).
Each command must exit 0.
"""

import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from conftest import REPO, shared_data_dir

from bert_jax.tools import demo

PREFIX = ".venv/bin/bert-jax "


def readme_commands() -> list[str]:
    """Every `.venv/bin/bert-jax ...` command in the README's code blocks, continuation
    lines joined and trailing comments dropped."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command.startswith(PREFIX):
                commands.append(command)
    return commands


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


def test_readme_lists_the_commands():
    commands = readme_commands()
    assert len(commands) >= 15
    for name in ("train", "eval", "sweep", "vocab", "info", "convert", "export", "features",
                 "translate", "average", "plot", "attention"):
        assert any(c.startswith(PREFIX + name + " ") for c in commands), name


@pytest.fixture(scope="module")
def small_glue(shared_data, tmp_path_factory):
    """Real MRPC files, the training file cut to its first 160 rows so that the README's
    fine-tuning and four-trial sweep take seconds (dev and test complete)."""
    folder = tmp_path_factory.mktemp("glue")
    (folder / "MRPC").mkdir()
    source = shared_data / "glue" / "MRPC"
    lines = (source / "train.tsv").read_bytes().splitlines(keepends=True)
    (folder / "MRPC" / "train.tsv").write_bytes(b"".join(lines[:161]))
    for name in ("dev.tsv", "test.tsv"):
        (folder / "MRPC" / name).write_bytes((source / name).read_bytes())
    return folder


def test_readme_commands_run_as_written(tmp_path, small_glue, hf_model, english_lines):
    lines = [english_lines[0], f"{english_lines[1]} ||| {english_lines[2]}"]
    (tmp_path / "sentences.txt").write_text("\n".join(lines) + "\n")
    demo.build_corpus(tmp_path / "demo_out" / "corpus")
    (tmp_path / "tmp").mkdir()
    user_files = {  # what the README says the user provides
        "/path/to/bert-base-uncased": hf_model, "/path/to/bert-base-cased": hf_model,
        "/path/to/uncased_L-12_H-768_A-12": REPO / "tests/fixtures/tf_bert_tiny",
        "/path/to/glue": small_glue, "/path/to/sentences.txt": tmp_path / "sentences.txt",
    }
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    for command in readme_commands():
        command = command.replace("demo_out/run", "/tmp/bert_text")
        command = command.replace("/tmp/", f"{tmp_path}/tmp/").replace(" configs/", f" {REPO}/configs/")
        command = command.replace("../shared/data/", f"{shared_data_dir()}/")
        for placeholder, path in user_files.items():
            command = command.replace(placeholder, str(path))
        args = shlex.split(command)[1:]
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "bert_jax", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        print(f"{time.time() - t0:5.1f}s  {command[:150]}")
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
