"""benchmarks/retrieval_recipe.sh refuses a bad MODEL or step count with one line naming the
variable, before it makes its workdir or runs anything (its whole run is the check in its
header, minutes long, not a test)."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env, says", [
    ({"MODEL": "roberta"}, "MODEL=roberta: choose bert or modernbert"),
    ({"STS_STEPS": "ten"}, "STS_STEPS=ten: give a whole number of steps"),
    ({"CONTRASTIVE_STEPS": "0"}, "CONTRASTIVE_STEPS=0: give a whole number of steps"),
    ({"PRETRAIN_STEPS": "-5"}, "PRETRAIN_STEPS=-5: give a whole number of steps"),
])
def test_a_bad_variable_is_one_line_before_any_work(env, says, tmp_path):
    work = tmp_path / "recipe"
    r = subprocess.run(["bash", "benchmarks/retrieval_recipe.sh", str(work)], cwd=ROOT,
                       env={**os.environ, "BERT_JAX_SHARED_DATA": str(tmp_path), **env},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(says)
    assert not work.exists() and r.stdout == ""
