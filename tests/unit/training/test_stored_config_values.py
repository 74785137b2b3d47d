"""A value of a checkpoint's stored model config that no model takes (edited by hand) is named
as the stored file's, not as a flag the user gave (training/checkpoint.py read_config)."""

import json
import shutil
from pathlib import Path

import pytest

from bert_jax.config import ConfigError
from bert_jax.training import checkpoint

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "bert_tiny_a208b4f"


@pytest.mark.parametrize("key, value, says", [
    ("num_layers", "2", "model.num_layers='2'"),
    ("activation", "swish", "model.activation='swish'"),
])
def test_a_bad_stored_model_value_names_the_stored_file(key, value, says, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    checkpoint.read_config(run)  # the fixture as it is reads
    stored = run / "checkpoints" / "2" / "config" / "metadata"
    config = json.loads(stored.read_text())
    config["model"][key] = value
    stored.write_text(json.dumps(config))
    (run / "checkpoints" / "2" / "checksums.json").unlink()  # (as an editor who knew of it would)
    with pytest.raises(ConfigError) as refused:
        checkpoint.read_config(run)
    message = str(refused.value)
    assert message.startswith(f"{run}/checkpoints/2/config/metadata (the config stored with the "
                              "checkpoint, not a flag): ")
    assert says in message and message.endswith("; restore the file")
