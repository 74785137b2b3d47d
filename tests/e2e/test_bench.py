"""The model benchmark's plumbing (the numbers come from `make bench`, not from tests): our
step's tokens/s and MFU are the step's own counts over the measured time, a peer runs through
peers.py (here with this environment's transformers), a missing peer is skipped with a reason,
and the table prints ratios."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.tools import modelbench


@pytest.mark.slow
def test_our_pretraining_step_reports_full_length_tokens_and_mfu():
    r = modelbench.pretrain_step((1, 32, 2, 64, 8), "float32", steps=2, warmup=1, seq=32,
                                 vocab_size=100)
    assert r["tokens_per_s"] == pytest.approx(8 * 32 / r["step_s"])  # every token is real
    assert 0 < r["mfu"] < 1 and r["peak_flops"] > 0


def test_a_peer_runs_through_peers_py_and_a_missing_one_is_skipped():
    pytest.importorskip("torch")
    r = modelbench.run_peer(sys.executable, [
        "pretrain", "--framework", "torch", "--layers", "1", "--hidden", "32", "--heads", "2",
        "--mlp", "64", "--seq", "32", "--batch", "2", "--steps", "1", "--warmup", "1",
        "--vocab", "100"])
    assert r["peer"] == "hf_torch" and r["tokens_per_s"] > 0, r
    missing = modelbench.run_peer("/nonexistent/python", ["pretrain"])
    assert "FileNotFoundError" in missing["skipped"]


def test_the_table_shows_ours_beside_the_peers_with_ratios():
    results = {"pretrain_base_float32": {"tokens_per_s": 600.0, "mfu": 0.2},
               "hf_flax_pretrain_base": {"tokens_per_s": 200.0},
               "hf_torch_pretrain_base": {"skipped": "no peers environment"},
               "finetune_sst2_packed": {"examples_per_s": 90.0, "dev_accuracy": 0.8},
               "hf_torch_finetune_sst2": {"examples_per_s": 30.0, "dev_accuracy": 0.79}}
    table = modelbench.table(results)
    base = next(line for line in table.splitlines() if "12x768" in line and "float32" in line)
    assert "600 tok/s" in base and "| 200 |" in base and "3.00x" in base
    assert "no peers environment" in base
    sst2 = next(line for line in table.splitlines() if "packed" in line)
    assert "90.0 ex/s" in sst2 and "3.00x" in sst2


@pytest.mark.slow
def test_restart_benchmark_resumes_from_the_cache(tmp_path, monkeypatch):
    """`bench restart`: a first run, and its resumed run with the cache (loads the train step)
    and without (compiles it)."""
    from bert_jax.tools import bench

    # Its three `bert-jax train` processes compile at XLA's -O0 (as the quick tier): what the
    # cache holds is the point, not how fast the programs run.
    monkeypatch.setenv("XLA_FLAGS", os.environ["XLA_FLAGS"] + " --xla_backend_optimization_level=0")

    small = ["--config.train.batch_size=16", "--config.data.max_seq_length=32",
             "--config.data.max_predictions_per_seq=5", "--config.model.vocab_size=256"]
    r = bench.bench_restart("configs/bert_pretrain.py:tiny", small, str(tmp_path))
    runs = r["runs"]
    assert list(runs) == ["first run (empty cache)", "resumed, cache on", "resumed, cache off"]
    assert r["resumed_from_step"] >= 1 and r["cache_bytes"] > 0
    # What the cache did, not how fast (no timing): the first run wrote the train step, the
    # resumed run with the cache loaded it (wrote no step program), the one without wrote none.
    steps = [[n for n in row["written"] if n.startswith("jit_wrapped-")] for row in runs.values()]
    assert steps[0] and not steps[1] and not steps[2], steps
    assert all(0 < row["compile_s"] < row["first_step_s"] for row in runs.values())  # a part of it
    assert r["table"].count("\n") == 4


def test_the_long_input_benchmark_configs_are_valid():
    """Each pattern of `bench long` on configs/bert_pretrain.py:long passes the checks made
    before training (lengths, blocks, window, projection), without training."""
    from helpers import REPO

    from bert_jax import config as config_lib
    from bert_jax.tools import bench

    for pattern in bench.LONG_PATTERNS.values():
        config = config_lib.load(str(REPO / "configs/bert_pretrain.py:long"), pattern)
        config_lib.validate(config, 1)
        assert config.data.max_seq_length == config.model.max_len == 4096


needs_libtpu = pytest.mark.skipif(not __import__("bert_jax.cloud.tpu").cloud.tpu.libtpu_installed(),
                                  reason="libtpu is not installed: bench attention plans with it")


@needs_libtpu
def test_the_attention_benchmark_plans_a_row_per_kernel_through_plan(capsys, monkeypatch):
    """`bench attention` at a tiny size (a 1-layer model, 256 tokens on a v5e-8: one compile):
    the splash row shows the step's memory, that it fits, and splash's FLOPs beside XLA's."""
    from bert_jax.models.kernels.splash import splash_flops
    from bert_jax.tools import bench

    monkeypatch.setattr(sys, "argv", [
        "bench", "attention", "--config", "configs/bert_pretrain.py:tiny", "--lengths", "256",
        "--topologies", "v5litepod-8", "--kernels", "splash", "--patterns", "local",
        "--config.model.num_layers=1", "--config.model.vocab_size=256"])
    bench.main()
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| v5litepod-8 | 256 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:4] == ["splash", "local"] and cells[5] == "yes (15.75)", row
    result = json.loads(out.splitlines()[-1])["rows"][0]
    assert 0 < result["temporaries_gib"] <= result["total_gib"] < 1 and result["fits"]
    assert cells[4] == f"{result['total_gib']} / {result['temporaries_gib']}"
    # 8 rows (one per device), window 64 in 128-token tiles: 4 of the 2 x 2 tiles, 2 heads of 64
    cfg = bench.attention_config("configs/bert_pretrain.py:tiny", "v5litepod-8", 256, "splash",
                                 "local", ["model.num_layers=1"])
    assert cfg.train.batch_size == 8 and cfg.data.max_predictions_per_seq == 38
    splash = splash_flops(models_cfg(cfg), 8, 256) / 8 / 1e9
    assert cells[6].endswith(f" + {round(splash, 1):,}") and splash == 4 * 9 * 2 * 128 ** 2 * 64 * 2 / 1e9
    assert "no GPU here (cpu): kernels not timed" in out


def models_cfg(config):
    from bert_jax import config as config_lib
    from bert_jax import models

    return models.split_model_config(config_lib.model_config(config))[1]


def test_kernel_timing_runs_each_kernel_it_is_given():
    """The GPU part of `bench attention` (cudnn beside xla there), here with xla on CPU."""
    from bert_jax.tools import bench

    rows = bench.time_kernels(["xla"], [64], heads=2, head_dim=8, tokens=128, steps=1,
                              dtype="float32")
    assert [(r["kernel"], r["tokens"], r["rows"]) for r in rows] == [("xla", 64, 2)]
    assert rows[0]["tokens_per_s"] > 0


@pytest.mark.slow  # two 4,096-token steps of a tiny BERT on a CPU, in a process of one device
def test_long_document_classification_trains_with_bigbird_at_4096_tokens(shared_data, tmp_path):
    """configs/glue.py:sst2,long on `bench longdoc`'s data (an excerpt per book here): a
    4,096-token row per Gutenberg excerpt, BigBird attention, trained and scored on unseen
    books."""
    import os
    import subprocess

    from helpers import REPO

    from bert_jax.tools import bench

    data = bench.build_longdoc(tmp_path / "data", per_book=1)
    train_rows = (data / "SST-2" / "train.tsv").read_text().splitlines()[1:]
    assert [r.rsplit("\t", 1)[1] for r in train_rows] == ["1", "1", "0", "0"]
    assert all(len(r.split()) == 2801 for r in train_rows)  # 2,800 words and the label
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "BERT_JAX_SHARED_DATA": str(shared_data)}
    run = subprocess.run(
        [sys.executable, "-m", "bert_jax", "train", "--config=configs/glue.py:sst2,long",
         f"--workdir={tmp_path / 'run'}", f"--config.data.data_dir={data}",
         f"--config.data.tokenizer={data / 'vocab'}", "--config.train.steps=2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == 2 and 0 <= summary["eval"]["eval/accuracy"] <= 1
    assert "batch 2 x 4096 tokens" in run.stderr + run.stdout


def test_the_long_document_configs_are_valid():
    """Each pattern of `bench longdoc` on configs/glue.py:sst2,long passes the checks made
    before training, at 4,096 tokens."""
    from helpers import REPO

    from bert_jax import config as config_lib
    from bert_jax.tools import bench

    for pattern in bench.LONGDOC_PATTERNS.values():
        config = config_lib.load(str(REPO / "configs/glue.py:sst2,long"), pattern)
        config_lib.validate(config, 1)
        assert config.data.max_seq_length == config.model.max_len == 4096 and not config.data.pack


# `bench pretrain` (bert_jax/tools/pretrainbench.py): time to quality.

def test_time_to_target_interpolates_between_checkpoints():
    from bert_jax.tools import pretrainbench as pb

    curve = [(10.0, 8.0), (20.0, 6.0), (30.0, 5.0)]
    assert pb.time_to(curve, 7.0) == pytest.approx(15.0)  # halfway from 8 to 6
    assert pb.time_to(curve, 8.5) == 10.0  # already at the first checkpoint
    assert pb.time_to(curve, 5.0) == 30.0
    assert pb.time_to(curve, 4.9) is None  # never reached


def test_the_target_is_the_worst_best_loss_and_ratios_are_against_hf():
    from bert_jax.tools import pretrainbench as pb

    def run(points):  # step -> (train_s, loss); wall_s = train_s + 10
        return {"timeline": {s: {"train_s": t, "wall_s": t + 10, "heldout_mlm_loss": loss,
                                 "tokens_per_step": 4096}
                             for s, (t, loss) in points.items()}}
    runs = {"bert2018": run({10: (20.0, 7.0), 20: (40.0, 6.0)}),
            "modern": run({10: (10.0, 6.0), 20: (20.0, 5.0)}),
            "hf": run({10: (40.0, 7.5), 20: (80.0, 6.5)})}
    s = pb.summarize(runs)
    assert s["target_loss"] == 6.5  # hf's best, the worst of the three
    t = s["time_to_target"]
    assert t["hf"]["train_s"] == 80.0 and t["hf"]["wall_s"] == 90.0
    assert t["bert2018"]["train_s"] == pytest.approx(30.0)  # halfway from 7 to 6
    assert t["modern"]["train_s"] == 10.0 and t["modern"]["step"] == 10
    assert s["speedup_vs_hf"]["modern"]["train_s"] == pytest.approx(8.0)
    assert s["speedup_vs_hf"]["bert2018"]["wall_s"] == pytest.approx(90 / 40)
    table = pb.tables(runs, s, None)
    assert "| modern recipe (ours) | 4096 | 5.000 | 10 | 10 | 20 | 8.00x | 4.50x |" in table


def test_masked_lm_loss_of_uniform_logits_is_log_vocab():
    from bert_jax.tools import pretrainbench as pb

    logits = np.zeros((2, 3, 8), np.float32)
    logits[0, 0, 5] = 100.0  # certain and right: loss 0
    labels = np.array([[5, 0, 1], [2, 3, 4]])
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)  # 3 positions count
    ce, correct = pb.masked_lm_loss(logits, labels, weights)
    assert ce == pytest.approx(2 * np.log(8), rel=1e-6)
    assert correct == 2  # the certain one, and label 0 (argmax of a uniform row is 0)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory, shared_data):
    from bert_jax.tools import pretrainbench as pb

    text = shared_data / "text"
    out = tmp_path_factory.mktemp("ttq") / "corpus"
    counts = pb.build_corpus([text / "wikitext2" / "valid.txt",
                              text / "gutenberg" / "blake-poems.txt"], out, vocab_size=600)
    return out, counts


def test_the_heldout_set_is_fixed_masked_at_15_percent_and_apart_from_training(tiny_corpus):
    from bert_jax.data import tokenizer as tokenizer_lib
    from bert_jax.tools import pretrainbench as pb

    corpus, counts = tiny_corpus
    assert counts["heldout"] >= 5 and counts["train"] == pytest.approx(19 * counts["heldout"], abs=19)
    train = (corpus / "train.txt").read_text().split("\n\n")
    heldout = (corpus / "heldout.txt").read_text().split("\n\n")
    assert not set(train) & (set(heldout) - {""})
    tok = tokenizer_lib.load_tokenizer(corpus / "vocab")
    a, b = (pb.heldout_set(corpus / "heldout.txt", tok, rows=32, seq_len=64) for _ in range(2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    real = a["attention_mask"].sum(1)
    masked = a["masked_lm_weights"].sum(1)
    assert np.all(masked == np.minimum(np.round(0.15 * real), 10))  # 15%, at most 10 of 64
    assert np.all(a["input_ids"][:, 0] == tok.cls_id) and not a["token_type_ids"].any()


def test_ours_and_hf_score_the_same_weights_alike(tiny_corpus, tmp_path):
    """The held-out loss is measured the same way for every recipe: a HF BertForMaskedLM and the
    same weights converted into ours score equal losses."""
    torch = pytest.importorskip("torch")
    from transformers import BertConfig, BertForMaskedLM

    from bert_jax.data import tokenizer as tokenizer_lib
    from bert_jax.tools import pretrainbench as pb

    corpus, counts = tiny_corpus
    tok = tokenizer_lib.load_tokenizer(corpus / "vocab")
    evalset = pb.heldout_set(corpus / "heldout.txt", tok, rows=16, seq_len=64)
    torch.manual_seed(0)
    hf = BertForMaskedLM(BertConfig(vocab_size=counts["vocab_size"], hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, max_position_embeddings=64))
    hf.save_pretrained(tmp_path / "hf")
    shutil.copy(corpus / "vocab" / "vocab.txt", tmp_path / "hf" / "vocab.txt")
    ours = pb.convert_hf(tmp_path / "hf", tmp_path / "ours")
    theirs = pb.score_hf({0: tmp_path / "hf"}, evalset, batch=8)[0]
    mine = pb.score_ours(ours, [0], evalset, batch=8)[0]
    assert mine["heldout_mlm_loss"] == pytest.approx(theirs["heldout_mlm_loss"], abs=1e-4)
    assert mine["heldout_mlm_accuracy"] == pytest.approx(theirs["heldout_mlm_accuracy"], abs=1e-3)
    assert theirs["heldout_mlm_loss"] == pytest.approx(np.log(counts["vocab_size"]), abs=0.5)


@pytest.fixture(scope="module")
def small_sst2(shared_data, tmp_path_factory):
    """A GLUE folder of SST-2's first 64 train and 64 dev rows: the bench tools' fine-tunings
    train their 2 steps and are scored in seconds (the whole dev set: 872 rows, and a compile
    per packed row count its batches reach, for a number no test reads)."""
    glue = tmp_path_factory.mktemp("small_glue")
    (glue / "SST-2").mkdir()
    for name in ("train.tsv", "dev.tsv"):
        rows = (shared_data / "glue" / "SST-2" / name).read_text().splitlines()[:1 + 64]
        (glue / "SST-2" / name).write_text("\n".join(rows) + "\n")
    return glue


@pytest.mark.slow
def test_bench_pretrain_runs_the_three_recipes_and_fine_tunes_them(tiny_corpus, tmp_path, shared_data,
                                                                   small_sst2):
    """The whole section at a toy size: 2 steps a recipe, a checkpoint each step, 2 SST-2 steps."""
    pytest.importorskip("torch")
    from bert_jax.tools import pretrainbench as pb

    text = shared_data / "text"
    r = pb.bench_pretrain(str(tmp_path), size="tiny", steps=2, batch=8, seq_len=128, every=1,
                          eval_rows=16, finetune_steps=2, vocab_size=600,
                          files=[text / "wikitext2" / "valid.txt",
                                 text / "gutenberg" / "blake-poems.txt"], glue_dir=small_sst2)
    assert list(r["runs"]) == ["bert2018", "modern", "hf"]
    for run in r["runs"].values():
        assert sorted(run["timeline"]) == [1, 2]
        p1, p2 = run["timeline"][1], run["timeline"][2]
        assert 0 < p1["train_s"] < p2["train_s"] <= p2["wall_s"]
        assert 0 < p2["heldout_mlm_loss"] < 2 * np.log(600)
        assert 0 < p2["tokens_per_step"] <= 8 * 128
    assert r["runs"]["hf"]["same_tokens_as_ours"] == 1.0
    best = [min(p["heldout_mlm_loss"] for p in run["timeline"].values())
            for run in r["runs"].values()]
    assert r["summary"]["target_loss"] == pytest.approx(max(best), abs=1e-4)
    assert all(0 <= f["dev_accuracy"] <= 1 and f["steps"] == 2 for f in r["finetune"].values())
    assert r["finetune"]["modern"]["config"] == "configs/glue.py:sst2,modernbert-tiny"
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["summary"]["target_loss"] == pytest.approx(max(best), abs=1e-3)
    assert (tmp_path / "result.md").read_text().startswith("| step |")



# `bench speedrun` (bert_jax/tools/speedrun.py): a fixed target, readouts, records, the table.

def speedrun_record(recipe, time_to, sst2, **kw):
    return {"date": "2026-11-28 05:00", "commit": "0123456789abcdef", "label": "", "recipe": recipe,
            "overrides": [], "steps": 1000, "target_loss": 5.0, "time_to_target_s": time_to,
            "step_to_target": None if time_to is None else 600.0,
            "tokens_to_target": None if time_to is None else 2_400_000,
            "flops_to_target": None if time_to is None else 1.5e14, "final_heldout_loss": 4.8,
            "readouts": {"sst2": {"metric": "accuracy", "median": sst2, "min": sst2 - 0.01,
                                  "max": sst2 + 0.02}}, **kw}


def test_speedrun_table_is_rendered_from_the_records_fastest_first(tmp_path):
    from bert_jax.tools import speedrun

    records = tmp_path / "speedrun.jsonl"
    assert speedrun.read_records(records) == []  # no file yet: no records
    for r in (speedrun_record("configs/modernbert.py:mini", None, 0.7),
              speedrun_record("configs/modernbert.py:mini", 900.0, 0.75, label="lr 2e-3",
                              overrides=["optimizer.learning_rate=2e-3"]),
              speedrun_record("configs/bert_pretrain.py:mini", 1200.0, 0.6)):
        speedrun.append_record(r, records)
    rows = speedrun.render_table(speedrun.read_records(records)).splitlines()[2:]
    assert len(rows) == 3
    assert rows[0].startswith("| configs/modernbert.py:mini (lr 2e-3) | `optimizer.learning_rate=2e-3` "
                              "| 01234567 | 5.00 | 1000 | 900 | 600 | 2,400,000 | 1.5e+14 | 4.800 | "
                              "accuracy 0.750 [0.740, 0.770] | - | - |")
    assert rows[1].startswith("| configs/bert_pretrain.py:mini | - |")
    assert "| not reached | not reached |" in rows[2]  # never reached: last
    assert "(no runs recorded yet)" in speedrun.render_table([])
    doc = tmp_path / "speedrun.md"
    doc.write_text(f"before\n{speedrun.TABLE_START}\nold rows\n{speedrun.TABLE_END}\nafter\n")
    table = speedrun.write_table(doc, records)
    assert doc.read_text() == (f"before\n{speedrun.TABLE_START}\n{table}\n{speedrun.TABLE_END}"
                               "\nafter\n")
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="no speedrun table markers"):
        speedrun.write_table(doc, records)


@pytest.mark.parametrize("line, says", [
    ('{"recipe": "configs/modernbert.py:mini"', ":2: not a JSON line"),
    ("[1, 2]", ":2: a JSON list, not a record"),
    (json.dumps({**speedrun_record("r", None, 0.7), "final_heldout_loss": "low"}),
     ":2: key 'final_heldout_loss' is \"low\", expected a number"),
    (json.dumps({k: v for k, v in speedrun_record("r", None, 0.7).items() if k != "readouts"}),
     ":2: no key 'readouts' (an object)"),
])
def test_a_damaged_speedrun_record_is_named_before_a_run(line, says, tmp_path, monkeypatch, capsys):
    # Found when the run starts, not when its record is appended half an hour later.
    from bert_jax.tools import bench, speedrun

    records = tmp_path / "speedrun.jsonl"
    records.write_text(json.dumps(speedrun_record("r", 900.0, 0.7)) + "\n" + line + "\n")
    with pytest.raises(ValueError, match="speedrun.jsonl" + re.escape(says)):
        speedrun.read_records(records)
    monkeypatch.setattr(speedrun, "RECORDS", records)
    monkeypatch.setattr(sys, "argv", ["bench", "speedrun", "--workdir", str(tmp_path / "run")])
    with pytest.raises(SystemExit):
        bench.main()
    assert says in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_speedrun_page_shows_the_table_of_the_records_file():
    """docs/speedrun.md's table is what write_table renders from benchmarks/speedrun.jsonl (it is
    never edited by hand)."""
    from bert_jax.tools import speedrun

    table = speedrun.render_table(speedrun.read_records(speedrun.RECORDS))
    assert f"{speedrun.TABLE_START}\n{table}\n{speedrun.TABLE_END}" in speedrun.DOC.read_text()


@pytest.mark.parametrize("argv, says", [
    (["speedrun", "--steps", "0"], "bench speedrun: error: speedrun --steps=0 --every=50: steps >= 1"),
    # A recipe without readouts (or a peer for it), as every other error of the tool.
    (["speedrun", "--recipe", "configs/glue.py:sst2"],
     "bench speedrun: error: speedrun: no fine-tuning recipe for 'configs/glue.py:sst2'"),
    (["speedrun", "--recipe", "configs/bert_pretrain.py:mini", "--peer"],
     "bench speedrun: error: speedrun --peer: HF's ModernBertForMaskedLM mirrors a "
     "configs/modernbert.py:<size> recipe"),
    (["attention", "--patterns", "full,nope"], "bench attention: error: --patterns: 'nope'; choose from"),
    (["speedrun", "--steps", "10", "--every", "20"], "--steps=10 --every=20"),
    (["speedrun", "--smoke", "--steps", "5"], "--smoke runs its own 2 steps"),
    (["speedrun", "--steps", "10", "--every", "5", "--config.train.batch_size=abc"],
     "--config.train.batch_size='abc': expected int"),
    (["speedrun", "--steps", "10", "--every", "5", "--glue", "{tmp}/nope"],
     "--glue={tmp}/nope: no SST-2/train.tsv there"),
    (["longplan", "--lengths", "16k"], "bench longplan: error: --lengths='16k': comma-separated whole"),
    (["longplan", "--lengths", "0"], "--lengths='0'"),
    (["longplan", "--lengths", "1024", "--remats", "nope"], "model.remat_policy='nope'; choose one of"),
    (["longplan", "--lengths", "1024", "--topologies", "v5litepod-1,v9-8"],
     "--topologies: --topology='v9-8': unknown TPU generation 'v9'"),
    (["longplan", "--lengths", "1024", "--config.model.attention_block_size=-128"],
     "model.attention_block_size=-128 must be >= 0"),
    (["longplan", "--lengths", "1000", "--topologies", "v5litepod-1"],
     "tiles a sequence of 1000 tokens in blocks of"),
])
def test_bench_flags_out_of_range_are_one_line_before_any_work(argv, says, tmp_path, monkeypatch,
                                                               capsys):
    # Checked before the corpus, the pretraining or the first plan (minutes to hours later),
    # never replaced by a default (`--steps 0` once meant 1,000) nor a traceback.
    from bert_jax.tools import bench

    monkeypatch.setattr(sys, "argv", ["bench", *[a.format(tmp=tmp_path) for a in argv],
                                      "--workdir", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exit:
        bench.main()
    err = capsys.readouterr().err
    assert exit.value.code == 1 and len(err.splitlines()) == 1 and says.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "run").exists()


def test_speedrun_recipe_readouts_and_flops():
    from helpers import REPO

    from bert_jax import config as config_lib
    from bert_jax.tools import speedrun

    spec = speedrun.finetune_spec
    assert spec("configs/modernbert.py:mini", "stsb") == "configs/glue.py:stsb,modernbert-mini"
    assert spec("/x/configs/bert_pretrain.py:tiny", "mrpc") == "configs/glue.py:mrpc,tiny"
    with pytest.raises(ValueError, match="no fine-tuning recipe"):
        speedrun.finetune_spec("configs/glue.py:sst2", "sst2")
    config = config_lib.load(str(REPO / speedrun.RECIPE))
    given = speedrun.recipe_overrides(config, REPO / "corpus", steps=100, batch=4, seq_len=128, every=10)
    assert "data.max_predictions_per_seq=39" in given  # room for 30% of 128
    assert "train.steps=100" in given and f"data.train_files={REPO / 'corpus' / 'train.txt'}" in given
    assert speedrun.training_flops(config, 128, 2000.0) == pytest.approx(
        2 * speedrun.training_flops(config, 128, 1000.0))
    assert speedrun.spread([0.5, 0.9, 0.7]) == {"values": [0.5, 0.9, 0.7], "median": 0.7,
                                                 "min": 0.5, "max": 0.9}


def test_a_record_names_the_commit_its_run_started_from(tmp_path, monkeypatch):
    """The commit of the checkout (and "+changes" when tracked files differ from it), taken
    when a run starts: a checkout that moves on while a run goes on does not relabel it."""
    from bert_jax.tools import speedrun

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "one")
    monkeypatch.setattr(speedrun.paths, "REPO", tmp_path)
    first = git("rev-parse", "HEAD")
    assert speedrun.commit() == first and re.fullmatch(r"[0-9a-f]{40}", first)
    (tmp_path / "notes.txt").write_text("untracked: not the code\n")
    assert speedrun.commit() == first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert speedrun.commit() == first + "+changes"
    monkeypatch.setattr(speedrun.paths, "REPO", tmp_path / "nowhere")
    assert speedrun.commit() == "unknown"


@pytest.mark.slow  # two pretraining steps, scoring, a fine-tuning, twice: ~60 s on 2 cores
def test_bench_speedrun_smoke_appends_records_that_the_table_renders(shared_data, tmp_path, monkeypatch,
                                                                   small_sst2):
    """Ours and the peer (HF's ModernBertForMaskedLM, scored as its conversion into ours
    scores), each a record in the workdir, both rows in the table."""
    pytest.importorskip("torch")
    from bert_jax.data import tokenizer as tokenizer_lib
    from bert_jax.tools import bench, speedrun
    from bert_jax.tools import pretrainbench as pb

    monkeypatch.setenv("BERT_JAX_SHARED_DATA", str(shared_data))
    published = speedrun.RECORDS.read_text()
    monkeypatch.setattr(sys, "argv", ["bench", "speedrun", "--smoke", "--workdir", str(tmp_path),
                                      "--glue", str(small_sst2), "--label", "lr 2e-3",
                                      "--config.optimizer.learning_rate=2e-3"])
    bench.main()
    (record,) = speedrun.read_records(tmp_path / "speedrun.jsonl")
    assert record["recipe"] == "configs/modernbert.py:tiny" and record["label"] == "lr 2e-3"
    assert record["overrides"] == ["optimizer.learning_rate=2e-3"] and record["seeds"] == [0]
    assert record["steps"] == 2 and 0 < record["tokens"] <= 2 * 8 * 128 and record["flops"] > 0
    assert record["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}(\+changes)?", record["commit"])
    assert record["target_loss"] == speedrun.TARGET_LOSS
    assert record["time_to_target_s"] is None and record["flops_to_target"] is None  # 2 steps
    assert 0 < record["final_heldout_loss"] < 2 * np.log(8192)
    assert sorted(record["curve"]) == ["1", "2"]
    sst2 = record["readouts"]["sst2"]
    assert list(record["readouts"]) == ["sst2"] and sst2["metric"] == "accuracy"
    assert len(sst2["values"]) == 1 and 0 <= sst2["min"] == sst2["median"] == sst2["max"] <= 1
    monkeypatch.setattr(sys, "argv", ["bench", "speedrun", "--smoke", "--peer", "--workdir",
                                      str(tmp_path), "--glue", str(small_sst2)])
    bench.main()
    peer = speedrun.read_records(tmp_path / "speedrun.jsonl")[1]
    assert peer["trainer"] == speedrun.PEER and peer["steps"] == 2 and peer["overrides"] == []
    assert list(peer["readouts"]) == ["sst2"] and 0 < peer["tokens"] <= 2 * 8 * 128
    tok = tokenizer_lib.load_tokenizer(tmp_path / "corpus" / "vocab")
    evalset = pb.heldout_set(tmp_path / "corpus" / "heldout.txt", tok, rows=16, seq_len=128)
    converted = pb.score_ours(tmp_path / "hf_converted", [0], evalset)[0]["heldout_mlm_loss"]
    assert converted == pytest.approx(peer["final_heldout_loss"], abs=1e-3)
    doc = tmp_path / "speedrun.md"
    shutil.copy(speedrun.DOC, doc)
    table = speedrun.write_table(doc, tmp_path / "speedrun.jsonl")
    assert "| configs/modernbert.py:tiny (lr 2e-3) | `optimizer.learning_rate=2e-3` |" in table
    assert "| HF ModernBertForMaskedLM: configs/modernbert.py:tiny | - |" in table
    assert table in doc.read_text() and "(no runs recorded yet)" not in table
    assert speedrun.RECORDS.read_text() == published  # a smoke run leaves the repo's records

def test_ragged_layout_gives_each_document_its_offset_and_length():
    from bert_jax.tools import devicebench

    seg = np.array([[1, 1, 2, 2, 2, 3, 0, 0], [5, 5, 5, 5, 7, 7, 7, 7]], np.int32)
    offsets, lengths = devicebench.ragged_layout(seg, 3)
    assert np.asarray(offsets).tolist() == [[0, 2, 5, -1], [0, 4, -1, -1]]
    assert np.asarray(lengths).tolist() == [[2, 3, 1], [4, 4, -1]]


def test_device_bench_batches_are_what_the_objectives_train_on():
    from bert_jax.tools import devicebench
    from bert_jax.training import objectives

    for name in devicebench.MODELS:
        config = devicebench.train_config(name, 128, "xla", 8, smoke=True)
        batch = modelbench.pretraining_batch(config, docs_per_row=3)
        spec = objectives.for_config(config).batch_spec(config)
        assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
            k: (s.shape, s.dtype) for k, s in spec.items()}
        if "segment_ids" in batch:  # packed: 3 documents filling each row, positions restart
            for seg, pos in zip(batch["segment_ids"], batch["positions"], strict=True):
                assert sorted(set(seg.tolist())) == [1, 2, 3] and np.all(np.diff(seg) >= 0)
                starts = np.flatnonzero(np.diff(seg)) + 1
                assert pos[0] == 0 and np.all(pos[starts] == 0)
        assert np.all(batch["masked_lm_positions"] < 128) and batch["input_ids"].max() < (
            config.model.vocab_size)


def test_every_device_bench_variant_is_a_valid_modernbert_run():
    from bert_jax.tools import devicebench
    from bert_jax.training import setup

    for label, changes in devicebench.VARIANTS.items():
        kernel = "cudnn" if "@cudnn" in changes else "xla"
        config = devicebench.train_config("modernbert-base", 1024, kernel, 16, smoke=False,
                                          extra=tuple(c for c in changes if c[0] != "@"))
        setup.check(config, platform="gpu", devices=1, processes=1, reads_data=False)
        assert config.model.scan_layers == ("scan_layers=false" not in str(changes)), label


@pytest.mark.slow  # every section's compiles at miniature shapes (about a minute on 2 cores)
def test_device_bench_smoke_measures_every_section_and_names_what_needs_a_gpu(tmp_path, monkeypatch):
    from bert_jax.tools import devicebench

    # two of the variants (their configs: the test above): the published run and a cuDNN one
    first, *_, last = devicebench.VARIANTS.items()
    monkeypatch.setattr(devicebench, "VARIANTS", dict([first, last]))
    out = tmp_path / "device.json"
    devicebench.run(out, smoke=True, sections=("embed",))
    r = devicebench.run(out, smoke=True, sections=("attention", "train", "variants", "peer"))
    assert json.loads(out.read_text()) == r and "embed" in r  # the earlier section is kept
    cpu = "needs a GPU; this machine computes on cpu"
    for row in r["attention"]:
        if row["kernel"] == "xla":  # bf16 against the f32 reference: rounding, not a bug
            assert row["tokens_per_s"] > 0 and max(row["max_rel_error"].values()) < 0.05, row
        else:
            assert row["skipped"] == cpu
    assert {row["layout"] for row in r["attention"] if "layout" in row} == {"padded", "packed"}
    timed = [row for row in r["train"] + r["variants"] if "tokens_per_s" in row]
    assert len(timed) == 2 + len(devicebench.VARIANTS) - 1, r
    assert all(np.isfinite(row["loss"]) and row["mfu"] > 0 for row in timed)
    # the published variant is the train section's ModernBERT row at 128 tokens: not run twice
    [published] = [row for row in r["train"] if (row["model"], row["kernel"]) == ("modernbert-base", "xla")]
    assert r["variants"][0]["measured_in"] == "train" and all(
        r["variants"][0][k] == published[k] for k in ("tokens_per_s", "mfu", "loss", "rows"))
    skipped = [row["skipped"] for row in r["train"] + r["variants"] if "skipped" in row]
    assert cpu in skipped and any("bidirectional local windows" in s for s in skipped)
    assert r["embed"][0]["texts_per_s"] > 0
    if "tokens_per_s" in r["peer"][0]:  # this environment's transformers has ModernBERT
        assert "x |" in out.with_suffix(".md").read_text().split("ModernBERT-base train step, bf16 |")[1]
    else:
        assert r["peer"][0]["skipped"].startswith("no PyTorch")
    table = out.with_suffix(".md").read_text()
    for header in ("attention layer", "train step", "sentence vectors", "one change"):
        assert header in table


def test_modernbert_bench_interleaves_ours_and_hf_and_reports_each_ratio():
    pytest.importorskip("torch")
    from bert_jax.tools import devicebench, modernbench

    r = modernbench.compare("mini", 128, "float32", variants=("sdpa",), repeats=2, steps=1,
                            extra=(*devicebench.SMOKE_MODEL, "model.attention_window=16"))
    assert r["rows"] == 4096 // 128 and set(r["tokens_per_s"]) == {"ours", "sdpa"}
    q, runs = r["ratios"]["sdpa"], r["runs"]
    ratios = sorted(a / b for a, b in zip(runs["ours"], runs["sdpa"], strict=True))  # ours / HF
    assert (q["min"], q["max"]) == (ratios[0], ratios[-1]) and len(ratios) == 2
    row = modernbench.table([r]).splitlines()[-1]
    assert row.startswith("| mini | 128 | 32 | float32 |") and f"{q['median']:.2f}x" in row


def test_the_long_plan_table_and_attention_share():
    """`bench longplan` (no compile here: its plans take minutes at 16k tokens; docs/tpu.md has
    its table): attention's share replaces the model's attention count (the pattern's keys) by
    splash's tiles; a row that does not fit shows the compiler's words."""
    from bert_jax.models import attention
    from bert_jax.tools import planbench

    cfg = planbench.longplan_config("configs/modernbert.py:mini", "v5litepod-1", 1024,
                                    ["model.num_layers=1"])
    assert (cfg.train.batch_size, cfg.model.attention_kernel, cfg.dtype) == (1, "splash", "bfloat16")
    assert cfg.data.max_predictions_per_seq == 308  # 30% of 1,024, rounded up
    keys = attention.kernel("xla").flops(models_cfg(cfg), 1, 1024, training=True)
    step = {"flops": keys + 6e9, "kernel_flops": 2e9}  # 6 GFLOP outside attention, on 1 device
    assert planbench.attention_share(cfg, step, 1) == pytest.approx(2 / 8)
    row = {"slice": "v5litepod-1", "tokens": 1024, "remat": "none", "fits": False,
           "total_gib": None, "hbm_gib": 15.75, "compiler_says": "exceeds available HBM (15.75G)",
           "blocks": {"block_q": 512, "block_kv": 512}, "model_tflop": 32.1,
           "splash_tflop_per_device": 34.46, "attention_share": 0.742, "step_s": 0.407,
           "mfu": 0.4, "roofline_s": 0.163, "block_choices": {128: 30.9, 512: 34.5}}
    assert planbench.table([row]).splitlines()[2] == (
        "| v5litepod-1 | 1,024 | none | 512 | no: \"exceeds available HBM (15.75G)\" (15.75) | "
        "32.1 | 34.46 | 74% | 0.407 at 40% / 0.163 | 128: 30.9, 512: 34.5 |")
