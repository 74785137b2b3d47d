"""The bert-jax command line, run as a user runs it (a subprocess per command)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO


def bert_jax(*args, check=True):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-m", "bert_jax", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"bert-jax {args} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def total_params(stdout: str) -> int:
    return int(re.search(r"^total\s+([\d,]+)", stdout, re.MULTILINE).group(1).replace(",", ""))


def test_info_prints_published_sizes():
    out = bert_jax("info", "--config", "configs/bert_pretrain.py:base").stdout
    assert abs(total_params(out) / 110e6 - 1) < 0.02
    assert "bert/encoder" in out and "encoder_per_token" in out
    out = bert_jax("info", "--config", "configs/wmt.py:big").stdout
    assert abs(total_params(out) / 213e6 - 1) < 0.02


def test_bad_override_is_a_clear_error():
    proc = bert_jax("info", "--config", "configs/bert_pretrain.py:base",
                    "--config.model.num_layer=3", check=False)
    assert proc.returncode != 0
    assert "num_layer" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_convert_then_features_match_pytorch(tmp_path, wordpiece_vocab, english_lines):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=1500, hidden_size=32, num_hidden_layers=4,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    hf = transformers.BertForPreTraining(cfg).eval()
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    (src / "vocab.txt").write_bytes(wordpiece_vocab.read_bytes())

    proc = bert_jax("convert", f"hf:{src}", str(tmp_path / "out"))
    assert "as bert_pretraining" in proc.stdout
    lines = [english_lines[0][:80], f"{english_lines[1][:50]} ||| {english_lines[2][:50]}"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    bert_jax("features", "--checkpoint", str(tmp_path / "out"), "--input",
             str(tmp_path / "in.txt"), "--output", str(tmp_path / "f.jsonl"),
             "--layers", "-1,-2,0", "--max_seq_length", "32", "--batch_size", "4")
    records = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1]

    tok = transformers.BertTokenizer(str(wordpiece_vocab), do_lower_case=True)
    for record, line in zip(records, lines):
        a, _, b = line.partition(" ||| ")
        enc = tok(a, b or None, truncation=True, max_length=32, return_tensors="pt")
        assert [f["token"] for f in record["features"]] == tok.convert_ids_to_tokens(
            enc["input_ids"][0])
        with torch.no_grad():
            hidden = hf.bert(**enc, output_hidden_states=True).hidden_states[1:]
        for layer_pos, index in enumerate([-1, -2, 0]):
            ours = np.array([f["layers"][layer_pos]["values"] for f in record["features"]])
            assert record["features"][0]["layers"][layer_pos]["index"] == index
            np.testing.assert_allclose(ours, hidden[index][0].numpy(), atol=2e-6)


def test_convert_missing_folder_is_a_clear_error(tmp_path):
    proc = bert_jax("convert", f"hf:{tmp_path / 'nope'}", str(tmp_path / "out"), check=False)
    assert proc.returncode == 1
    assert "config.json: not found" in proc.stderr and "Traceback" not in proc.stderr


def test_each_command_is_one_record_of_the_table():
    """A record names flags that exist and usage that starts with its name; every flag of the
    command line is read by some command; the entry points of earlier installs lead here."""
    from absl import flags

    from bert_jax import commands, main, sweep
    from bert_jax.commands import options
    from bert_jax.commands import sweep as sweep_command

    defined = {f.name for f in flags.FLAGS.get_key_flags_for_module(options)}
    used = set()
    for name, command in commands.COMMANDS.items():
        assert command.name == name and command.usage[0].startswith(f"bert-jax {name} "), name
        assert command.run.__doc__ and set(command.flags) <= defined, name
        assert {flag for flag, _, _ in command.read_only} <= set(command.flags), name
        used |= set(command.flags)
    assert used == defined
    assert main.run is commands.run and sweep.sweep_config is sweep_command.sweep_config


def test_help_lists_every_command_and_a_command_its_flags(cli):
    from bert_jax import commands

    code, out, err = cli(["--help"])
    assert code == 0 and not err
    for name, command in commands.COMMANDS.items():
        assert re.search(rf"^  {name} +\S", out, re.MULTILINE), name
        assert all(f"  {line}\n" in out for line in command.usage), name
    code, out, _ = cli(["eval", "--help"])
    assert code == 0 and out.startswith("usage:\n  bert-jax eval --workdir <dir>")
    assert "Evaluates saved checkpoints" in out
    assert [line.split(":")[0] for line in out.split("flags:\n")[1].splitlines()] == [
        "  --workdir", "  --config", "  --step", "  --split", "  --compilation_cache",
        "  --compilation_cache_required"]
    code, _, err = cli(["nonsense"])
    assert code == 2 and "unknown command 'nonsense'" in err and "train, eval, sweep" in err
