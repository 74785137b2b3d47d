"""Translation end to end on real parallel text (Multi30k): configs/multi30k.py trained
briefly through the real CLI, dev BLEU during training, `translate` (greedy and beam, with
sacreBLEU against a reference) and `average` from the command line, kill -9 and resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sacrebleu
from helpers import REPO, shared_data_dir

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.training import metrics
from bert_jax.translation.bleu import read_lines

MT = shared_data_dir() / "mt" / "multi30k"
pytestmark = [pytest.mark.skipif(not MT.is_dir(), reason=f"Multi30k not found at {MT}"),
              pytest.mark.slow]  # trains a Transformer (and kills one)

# A tiny model on the 1,014 dev pairs: ~0.1 s per step on 2 cores.
TINY = ["--config.model.num_layers=1", "--config.model.num_decoder_layers=1",
        "--config.model.emb_dim=32", "--config.model.num_heads=2", "--config.model.head_dim=16",
        "--config.model.mlp_dim=64", "--config.model.vocab_size=512",
        "--config.data.max_seq_length=32", "--config.train.batch_size=16",
        "--config.train.log_every=1", "--config.schedule.warmup_steps=5",
        "--config.data.bleu_sentences=16", "--config.decode.batch_size=8",
        "--config.decode.max_extra=5"]


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mt_spm")
    lines = read_lines(MT / "val.en.gz") + read_lines(MT / "val.de.gz")
    tokenizer_lib.train_vocab(lines, size=512, kind="sentencepiece", out_dir=out, lowercase=False,
                              sp_model_type="bpe")
    return out


def _args(workdir, spm_dir, *extra):
    return ["train", "--config=configs/multi30k.py", f"--workdir={workdir}", *TINY,
            f"--config.data.tokenizer={spm_dir}", f"--config.data.train_files={MT}/val.{{lang}}.gz",
            f"--config.data.eval_files={MT}/test_2016_flickr.{{lang}}.gz", *extra]


def _losses(workdir) -> dict[int, float]:
    rows = metrics.read_metrics(Path(workdir) / "metrics.jsonl")
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def run(tmp_path_factory, spm_dir):
    """A 12-step run with checkpoints every 4 steps and dev BLEU at the end, in-process."""
    from absl import flags

    from bert_jax import commands
    workdir = tmp_path_factory.mktemp("mt_run")
    argv = _args(workdir, spm_dir, "--config.train.steps=12", "--config.train.checkpoint_every=4",
                 "--config.train.eval_every=12")
    old, cwd = sys.argv, os.getcwd()
    sys.argv = ["bert-jax", *argv]
    os.chdir(REPO)
    try:
        commands.run()
    except SystemExit as e:
        assert not e.code, e.code
    finally:
        sys.argv = old
        os.chdir(cwd)
        flags.FLAGS.unparse_flags()
        commands.options.LoadedConfig.reset()
    return workdir


def test_training_logs_loss_and_dev_bleu(run):
    rows = metrics.read_metrics(run / "metrics.jsonl")
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 12 and losses[-1] < losses[0]
    evals = [r for r in rows if "eval/bleu" in r]
    assert len(evals) == 1 and evals[0]["step"] == 12
    assert 0.0 <= evals[0]["eval/bleu"] <= 100.0
    assert {"eval/loss", "eval/nll_loss", "eval/token_accuracy"} <= set(evals[0])
    assert tokenizer_lib.has_tokenizer(run)  # the workdir carries its tokenizer for translate


def test_translate_greedy_and_beam_write_one_line_per_input_and_score(run, tmp_path, cli):
    src = tmp_path / "src.en"
    sources = read_lines(MT / "test_2016_flickr.en.gz")[:12]
    refs = read_lines(MT / "test_2016_flickr.de.gz")[:12]
    src.write_text("".join(s + "\n" for s in sources), "utf-8")
    (tmp_path / "ref.de").write_text("".join(s + "\n" for s in refs), "utf-8")
    outs = {}
    for beam in (1, 3):
        out = tmp_path / f"out{beam}.de"
        code, stdout, err = cli(["translate", f"--checkpoint={run}", f"--input={src}",
                                 f"--output={out}", f"--beam={beam}", "--batch_size=8",
                                 f"--reference={tmp_path / 'ref.de'}"])
        assert code == 0, err
        hyps = out.read_text("utf-8").splitlines()
        assert len(hyps) == 12
        report = json.loads(stdout.strip().splitlines()[-1])
        # The printed score is sacreBLEU's own on the written file.
        expected = sacrebleu.corpus_bleu(hyps, [refs]).score
        assert report["sacrebleu"]["bleu"] == pytest.approx(expected)
        assert "tok:13a" in report["sacrebleu"]["signature"]
        outs[beam] = hyps
    code, _, err = cli(["translate", f"--checkpoint={run}", f"--input={src}",
                        f"--output={tmp_path / 'x'}", f"--reference={src}.missing"])
    assert code == 1 and "src.en.missing" in err and not (tmp_path / "x").exists()


def test_average_from_the_command_line_is_a_checkpoint_translate_takes(run, tmp_path, cli):
    out = tmp_path / "avg"
    code, stdout, err = cli(["average", f"--workdir={run}", "--last=3", f"--out={out}"])
    assert code == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["steps"] == [4, 8, 12]
    src = tmp_path / "src.en"
    src.write_text("A man rides a bike.\nTwo dogs play in the snow.\n", "utf-8")
    code, _, err = cli(["translate", f"--checkpoint={out}", f"--input={src}",
                        f"--output={tmp_path / 'out.de'}", "--beam=2"])
    assert code == 0, err
    assert len((tmp_path / "out.de").read_text("utf-8").splitlines()) == 2
    code, _, err = cli(["average", f"--workdir={run}", "--last=3", f"--out={out}"])
    assert code == 1 and "--out" in err  # never overwrites a checkpoint


def test_kill_9_then_resume_is_bitwise_identical(run, spm_dir, tmp_path, cli):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    argv = _args(tmp_path, spm_dir, "--config.train.steps=12", "--config.train.checkpoint_every=4",
                 "--config.train.eval_every=12", "--config.data.bleu_sentences=-1")
    proc = subprocess.Popen([sys.executable, "-m", "bert_jax", *argv], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (tmp_path / "checkpoints" / "4").is_dir() or max(_losses(tmp_path), default=0) < 5:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    code, out, err = cli(argv)  # the resume in-process: only the killed run need be a process
    assert code == 0, err[-2000:]
    assert "resumed from" in out
    got, want = _losses(tmp_path), _losses(run)
    assert sorted(got) == list(range(1, 13))
    assert [got[s] for s in range(1, 13)] == [want[s] for s in range(1, 13)]  # bitwise


def test_eval_of_a_saved_run_reports_dev_bleu(run, cli):
    code, stdout, err = cli(["eval", f"--workdir={run}"])
    assert code == 0, err
    result = json.loads(stdout.strip().splitlines()[-1])
    trained = [r for r in metrics.read_metrics(run / "metrics.jsonl") if "eval/bleu" in r][0]
    assert result["step"] == 12
    # The same checkpoint, dev set and decoding as the evaluation during training.
    assert result["eval/bleu"] == pytest.approx(trained["eval/bleu"])
    assert result["eval/loss"] == pytest.approx(trained["eval/loss"], rel=1e-5)
