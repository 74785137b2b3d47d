"""Pictures: the attention probabilities the model code returns, `bert-jax attention` (figure,
self-contained HTML, JSON data), `bert-jax plot` (curves equal the metrics file, phases
marked, several runs) and the sweep figure."""

import json
import re
import statistics

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.commands import sweep
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.training import checkpoint, train
from bert_jax.viz import plots

TINY = dict(emb_dim=32, num_layers=2, num_heads=4, head_dim=8, mlp_dim=48, max_len=64)


def tiny(name, vocab_size=97, **kw):
    if name in ("transformer", "decoder_lm"):
        fields = models.transformer_model_fields("base", vocab_size=vocab_size)
        fields.update(TINY, num_decoder_layers=2)
        if name == "decoder_lm":
            fields.update(norm="pre", positions="learned", scale_embeddings=False)
    else:
        fields = {**models.bert_model_fields("tiny"), **TINY, "vocab_size": vocab_size}
    return models.model_section(name, fields, **kw)


# The models run under nnx.jit: one program per call, where eagerly each operation is a compile
# of its own. `attention_out` is a dict the model fills while it runs: made inside the jitted
# function and returned beside the outputs.
plain = nnx.jit(lambda model, *args, **kw: model(*args, **kw))


@nnx.jit
def with_attention(model, *args, **kw):
    found = {}
    return model(*args, attention_out=found, **kw), found


@pytest.mark.parametrize("scan", [False, True])
def test_bert_returns_the_attention_its_output_is_made_of(scan):
    model = models.create_model(tiny("bert", scan_layers=scan))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, 97, (2, 10)), jnp.int32)
    mask = jnp.asarray(np.arange(10) < np.array([[10], [6]]), jnp.int32)  # row 1: 4 padding keys
    types = jnp.zeros_like(ids)
    out, found = with_attention(model, ids, types, mask)
    fused = plain(model, ids, types, mask)  # the fast fused attention, no probabilities
    # With probabilities asked for, the output is computed from them: same result.
    np.testing.assert_allclose(out["sequence_output"], fused["sequence_output"], atol=1e-5)
    p = np.asarray(found["encoder"])
    assert p.shape == (2, 2, 4, 10, 10)  # layers, batch, heads, queries, keys
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    assert (p[:, 1, :, :, 6:] == 0).all()  # padding keys get exactly 0
    assert (p[:, 1, :, :, :6] > 0).all()


def test_encoder_decoder_and_lm_return_their_attention():
    model = models.create_model(tiny("transformer"))
    src = jnp.asarray([[5, 6, 7, 8, 3, 0, 0]], jnp.int32)  # 2 padding source tokens
    tgt_in = jnp.asarray([[0, 9, 10, 11]], jnp.int32)
    seg = jnp.ones_like(tgt_in)  # the start token 0 is not padding
    logits, found = with_attention(model, src, tgt_in, tgt_segments_BT=seg)
    np.testing.assert_allclose(logits, plain(model, src, tgt_in, tgt_segments_BT=seg), atol=1e-5)
    assert found["encoder"].shape == (2, 1, 4, 7, 7)
    assert found["decoder"].shape == (2, 1, 4, 4, 4) and found["cross"].shape == (2, 1, 4, 4, 7)
    for p in found.values():
        np.testing.assert_allclose(np.asarray(p).sum(-1)[..., :4], 1.0, atol=1e-5)
    assert (np.asarray(found["cross"])[..., 5:] == 0).all()  # padding source tokens
    future = np.triu(np.ones((4, 4), bool), k=1)
    assert (np.asarray(found["decoder"])[..., future] == 0).all()  # causal: no future keys
    lm = models.create_model(tiny("decoder_lm"))
    _, found = with_attention(lm, jnp.asarray([[5, 6, 7]], jnp.int32))
    assert (np.asarray(found["decoder"])[..., np.triu(np.ones((3, 3), bool), k=1)] == 0).all()


@pytest.fixture(scope="module")
def tokenizer_dir(english_lines, tmp_path_factory):
    return tokenizer_lib.train_vocab(english_lines, size=600, kind="wordpiece",
                                     out_dir=tmp_path_factory.mktemp("pic_vocab"))


def saved_model(tmp_path, name, tokenizer_dir, **fields):
    """A checkpoint folder of a fresh tiny `name` model (with `fields`) with the tokenizer beside it."""
    tok = tokenizer_lib.load_tokenizer(tokenizer_dir)
    cfg = tiny(name, vocab_size=tok.vocab_size, **fields)
    params = nnx.to_pure_dict(nnx.state(models.create_model(cfg), nnx.Param))
    checkpoint.save_params(tmp_path, 1, params, {"model": cfg})
    tok.save(tmp_path)
    return tmp_path


def test_attention_command_writes_figure_html_and_data(cli, tmp_path, tokenizer_dir):
    ckpt = saved_model(tmp_path / "bert", "bert_classification", tokenizer_dir)
    code, out, err = cli(["attention", f"--checkpoint={ckpt}", "--text=The cat sat on the mat.",
                          "--pair=It was warm."])
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    plots_dir = ckpt / "plots"
    assert report["figure"] == str(plots_dir / "attention.png")
    assert (plots_dir / "attention.png").stat().st_size > 10_000
    data = json.loads((plots_dir / "attention.json").read_text())
    m = data["maps"]["self-attention"]
    tokens = m["keys"]
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and m["queries"] == tokens
    probs = np.asarray(m["probs"])
    assert probs.shape == (2, 4, len(tokens), len(tokens))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-3)  # rounded to 4 decimals
    # The HTML page is self-contained (no scripts or styles fetched) and holds the same data.
    page = (plots_dir / "attention.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<script src" not in page
    state = json.loads(re.search(r"const STATE = (.*);\n", page).group(1))
    np.testing.assert_allclose(state["data"]["maps"]["self-attention"]["probs"], probs, atol=1e-3)
    assert state["layer"] == 1 and state["head"] == 0  # the defaults: last layer, head 0
    # One output chosen by name; a bad head is a clear error.
    code, out, _ = cli(["attention", f"--checkpoint={ckpt}", "--text=Hello there.",
                        f"--out={tmp_path / 'one.svg'}", "--layer=0", "--head_index=3"])
    assert code == 0 and (tmp_path / "one.svg").is_file() and (tmp_path / "one.json").is_file()
    code, _, err = cli(["attention", f"--checkpoint={ckpt}", "--text=Hi.", "--head_index=4",
                        f"--out={tmp_path / 'bad.png'}"])
    assert code == 1 and "--head_index=4 is out of range for 4 heads" in err


def test_attention_of_linformer_labels_its_keys_as_projections(tmp_path, tokenizer_dir):
    # Its keys are linformer_k learned mixes of every token, never tokens: labelled as such
    # (they once carried the first token names, on 4 columns for a longer input).
    from bert_jax.viz import attention_maps

    ckpt = saved_model(tmp_path, "bert_classification", tokenizer_dir, attention_pattern="linformer",
                       linformer_k=4)
    report = attention_maps.attention(str(ckpt), "The cat sat on the warm mat today.",
                                      out=str(tmp_path / "lin.svg"))
    m = json.loads((tmp_path / "lin.json").read_text())["maps"]["self-attention"]
    assert m["keys"] == ["proj 0", "proj 1", "proj 2", "proj 3"] and len(m["queries"]) > 4
    assert m["key_axis"].startswith("linformer projection")
    assert np.asarray(m["probs"]).shape[-2:] == (len(m["queries"]), 4)
    assert report["tokens"] == m["queries"] and report["tokens"][0] == "[CLS]"
    svg = (tmp_path / "lin.svg").read_text()
    assert "linformer projection" in svg and "proj 3" in svg
    # Names that do not fit the axes they label are refused, not drawn.
    with pytest.raises(ValueError, match="4 keys cannot be labelled with 3 x 2 names"):
        attention_maps._map(["a", "b", "c"], ["a", "b"], np.zeros((1, 1, 2, 3, 4)))


def test_attention_of_a_translation_shows_cross_attention(tmp_path, tokenizer_dir):
    from bert_jax.viz import attention_maps

    ckpt = saved_model(tmp_path, "transformer", tokenizer_dir)
    report = attention_maps.attention(str(ckpt), "The cat sat.", out=str(tmp_path / "t.html"))
    data = json.loads((tmp_path / "t.json").read_text())
    assert list(data["maps"]) == ["cross-attention", "encoder self-attention", "decoder self-attention"]
    cross = data["maps"]["cross-attention"]
    assert cross["keys"][-1] == "[SEP]" and len(cross["queries"]) >= 1  # source ends with EOS
    assert report["translation"] == data["translation"]
    dec = np.asarray(data["maps"]["decoder self-attention"]["probs"])
    assert (dec[..., np.triu(np.ones(dec.shape[-2:], bool), k=1)] == 0).all()


def test_attention_of_a_decoder_lm_is_causal(tmp_path, tokenizer_dir):
    from bert_jax.viz import attention_maps

    ckpt = saved_model(tmp_path, "decoder_lm", tokenizer_dir)
    attention_maps.attention(str(ckpt), "The cat sat.", out=str(tmp_path / "lm.html"))
    m = json.loads((tmp_path / "lm.json").read_text())["maps"]["causal self-attention"]
    probs = np.asarray(m["probs"])
    assert probs.shape[-2:] == (len(m["queries"]),) * 2 and m["queries"] == m["keys"]
    assert (probs[..., np.triu(np.ones(probs.shape[-2:], bool), k=1)] == 0).all()
    with pytest.raises(ValueError, match="--pair"):
        attention_maps.attention(str(ckpt), "The cat sat.", "A pair.", out=str(tmp_path / "x.png"))


def test_attention_in_a_second_format_shares_its_data_but_never_replaces_another(tmp_path, tokenizer_dir):
    from bert_jax.viz import attention_maps

    ckpt = saved_model(tmp_path, "decoder_lm", tokenizer_dir)
    attention_maps.attention(str(ckpt), "The cat sat.", out=str(tmp_path / "a.html"))
    data = (tmp_path / "a.json").read_bytes()
    attention_maps.attention(str(ckpt), "The cat sat.", out=str(tmp_path / "a.svg"))  # same maps
    assert (tmp_path / "a.json").read_bytes() == data and (tmp_path / "a.svg").is_file()
    with pytest.raises(FileExistsError, match=f"^--out={tmp_path}/a.png: {tmp_path}/a.json already "
                                              "exists and holds other data than attention would"):
        attention_maps.attention(str(ckpt), "Another text.", out=str(tmp_path / "a.png"))
    assert (tmp_path / "a.json").read_bytes() == data and not (tmp_path / "a.png").exists()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two short pretraining runs with a sequence-length phase at step 5 and evaluations. Without
    dropout: the seed's dropout key is a constant of the compiled step, so with it the second
    run compiled its two steps again; without it the runs differ in their initial parameters
    and data only, and the second's programs come from the compilation cache."""
    root = tmp_path_factory.mktemp("runs")
    args = ["data.name=synthetic", "model.vocab_size=256", "train.batch_size=8",
            "model.dropout_rate=0.0", "model.attention_dropout_rate=0.0",
            "train.log_every=1", "schedule.warmup_steps=2", "train.steps=8", "train.eval_every=4",
            "train.eval_steps=1", "data.phases=((0, 32, 5), (5, 64, 10))", "train.checkpoint_every=4"]
    for seed in (0, 1):
        config = config_lib.load("configs/bert_pretrain.py:tiny", args + [f"seed={seed}"])
        train.train_and_evaluate(config, str(root / f"seed{seed}"))
    return root / "seed0", root / "seed1"


@pytest.mark.slow
def test_plot_draws_what_the_metrics_file_holds(two_runs, cli, tmp_path):
    from bert_jax.training.metrics import read_metrics

    code, out, err = cli(["plot", f"--workdir={two_runs[0]}", str(two_runs[1])])
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["figure"] == str(two_runs[0] / "plots" / "metrics.png")
    assert report["phase_starts"] == {"seed0": [5], "seed1": [5]}
    assert {"loss", "learning_rate", "masked_lm_accuracy", "eval/masked_lm_accuracy"} <= set(report["series"])
    # The figure's data file is the metrics file, value for value.
    import csv
    rows = list(csv.DictReader(open(report["data"])))
    for run in two_runs:
        metrics = read_metrics(run / "metrics.jsonl")
        for series in ("loss", "eval/masked_lm_loss"):
            want = [(r["step"], r[series]) for r in metrics if series in r]
            got = [(int(r["step"]), float(r["value"])) for r in rows
                   if r["run"] == run.name and r["series"] == series]
            assert got == want and want
    # And so are the drawn lines (raw train values, eval points), for both runs.
    runs = [plots.load_run(str(d)) for d in two_runs]
    fig, _ = plots.plot_runs(runs, x="step", smoothing=0.6)
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines() if line.get_gid()}
    for run in two_runs:
        metrics = read_metrics(run / "metrics.jsonl")
        raw = lines[f"{run.name}|loss|raw"]
        assert list(raw.get_ydata()) == [r["loss"] for r in metrics if "loss" in r]
        assert list(raw.get_xdata()) == [r["step"] for r in metrics if "loss" in r]
        ev = lines[f"{run.name}|eval/loss|eval"]
        assert list(ev.get_ydata()) == [r["eval/loss"] for r in metrics if "eval/loss" in r]
        smoothed = lines[f"{run.name}|loss|smoothed"].get_ydata()
        assert smoothed[0] == raw.get_ydata()[0] and not np.allclose(smoothed, raw.get_ydata())
        assert list(lines[f"{run.name}|learning_rate|raw"].get_ydata()) == [
            r["learning_rate"] for r in metrics if "learning_rate" in r]  # never smoothed
    phase_lines = [line for line in fig.axes[0].get_lines() if list(line.get_xdata()) == [5, 5]]
    assert len(phase_lines) == 2  # the phase start, once per run
    # Against tokens and wall time: increasing, tokens adding up each window's real tokens.
    for x in ("tokens", "time"):
        _, xs = plots.x_values(runs[0], x)
        assert (np.diff(xs) > 0).all() and xs[0] > 0
    _, tokens = plots.x_values(runs[0], "tokens")
    first = [r for r in read_metrics(two_runs[0] / "metrics.jsonl") if "loss" in r][0]
    assert tokens[0] == pytest.approx(first["tokens_per_sec"] / first["steps_per_sec"])
    code, _, err = cli(["plot", f"--workdir={two_runs[0]}", f"--out={tmp_path / 'c.svg'}", "--x=tokens"])
    assert code == 0 and (tmp_path / "c.svg").is_file() and (tmp_path / "c.csv").is_file()
    code, _, err = cli(["plot", f"--workdir={tmp_path / 'nothing'}"])
    assert code == 1 and "no metrics.jsonl" in err


def test_points_outside_the_logged_steps_are_not_misplaced():
    """A run still in phase 1 has no phase line yet; an eval after the last train row sits at
    its own step (and is left off the time axis, where its x is unknown)."""
    train_rows = [{"step": s, "loss": 1.0 / s, "steps_per_sec": 2.0, "time": 100.0 + s / 2}
                  for s in (10, 20, 30)]
    run = plots.Run("r", train_rows, [{"step": 35, "eval/loss": 0.5}], phase_starts=[900])
    fig, data = plots.plot_runs([run], x="step")
    ev = [d for d in data if d["series"] == "eval/loss"]
    assert [(d["step"], d["x"]) for d in ev] == [(35, 35.0)]
    assert not [line for ax in fig.axes for line in ax.get_lines() if not line.get_gid()]
    _, data = plots.plot_runs([run], x="time")
    assert not [d for d in data if d["series"] == "eval/loss"]
    _, hours = plots.x_values(run, "time")
    np.testing.assert_allclose(hours * 3600, [5.0, 10.0, 15.0])  # from 5 s before the first row


def test_html_page_keeps_user_text_as_text():
    from bert_jax.viz import attention_maps

    text = "{{DATA}} <img src=x onerror=alert(1)> </script><!--<script>"
    probs = np.full((1, 1, 2, 2), 0.5, np.float32)
    result = {"model": "bert", "text": text, "pair": None, "default_map": "self-attention",
              "maps": {"self-attention": {"queries": ["<b>", "&"], "keys": ["<b>", "&"],
                                          "probs": probs}}}
    page = attention_maps.html_page(result)
    assert "<img" not in page and page.count("</script>") == 1 and "<!--" not in page
    state = json.loads(re.search(r"const STATE = (.*);\n", page).group(1))
    assert state["data"]["text"] == text and state["data"]["maps"]["self-attention"]["keys"] == ["<b>", "&"]


def test_sweep_figure_shows_each_seed_and_the_median():
    rows = [{"optimizer.learning_rate": lr, "seed": s, "eval/accuracy": acc}
            for lr, accs in ((1e-4, (0.5, 0.7, 0.6)), (3e-4, (0.8, 0.9))) for s, acc in enumerate(accs)]
    rows.append({"optimizer.learning_rate": 1e-3, "seed": 0, "eval/accuracy": None})  # unfinished
    sw = sweep.sweep_config("glue.py:mrpc", {"optimizer.learning_rate": (1e-4, 3e-4, 1e-3)})
    labels = sweep.setting_labels(sw, sweep._groups(sw, rows, "eval/accuracy"))
    fig = plots.sweep_figure(labels, "eval/accuracy", "mrpc: eval/accuracy per setting")
    drawn = {c.get_gid(): c for c in fig.axes[0].collections}
    assert drawn["seeds|0"].get_offsets()[:, 1].tolist() == [0.5, 0.7, 0.6]
    assert drawn["seeds|1"].get_offsets()[:, 1].tolist() == [0.8, 0.9]
    medians = [float(seg[0][1]) for seg in drawn["medians"].get_segments()]
    assert medians == [0.6, statistics.median([0.8, 0.9])]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["learning_rate=0.0001", "learning_rate=0.0003"]
    assert sweep.__doc__ and "results.png" in sweep.__doc__


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(config_lib.MissingExtra, match=r"pip install 'bert_jax\[plot\]'"):
        plots.new_figure()


def test_the_same_plot_in_a_second_format_shares_its_data_file_but_never_replaces_another(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    first = plots.plot_workdirs([str(run)], str(tmp_path / "m.png"))
    data = (tmp_path / "m.csv").read_bytes()
    assert b"r,loss,2,2.0,1.5," in data
    second = plots.plot_workdirs([str(run)], str(tmp_path / "m.svg"))  # the same rows: accepted
    assert (second["data"], (tmp_path / "m.csv").read_bytes()) == (first["data"], data)
    assert (tmp_path / "m.svg").read_bytes().lstrip().startswith(b"<?xml")
    # The run went on: m.csv holds its earlier data, kept, and no m.pdf is written.
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 1.2}\n')
    with pytest.raises(FileExistsError, match=f"^--out={tmp_path}/m.pdf: {tmp_path}/m.csv already "
                                              "exists and holds other data than plot would write"):
        plots.plot_workdirs([str(run)], str(tmp_path / "m.pdf"))
    assert (tmp_path / "m.csv").read_bytes() == data and not (tmp_path / "m.pdf").exists()


def test_one_runs_maps_share_their_data_file_however_the_checkpoint_is_typed(cli, tmp_path, tokenizer_dir):
    # The data file beside a figure names the checkpoint resolved: the same maps drawn in
    # another format, from `runs/x/` or `runs/y/../x`, hold the same bytes (not "another run's").
    ckpt = saved_model(tmp_path / "bert", "bert_classification", tokenizer_dir)
    for typed, out in ((ckpt, "a.png"), (f"{ckpt}/", "a.svg"), (f"{tmp_path}/bert/../bert", "a.html")):
        code, _, err = cli(["attention", f"--checkpoint={typed}", "--text=The cat sat.",
                            f"--out={tmp_path / out}"])
        assert code == 0, err
    assert json.loads((tmp_path / "a.json").read_text())["checkpoint"] == str(ckpt)
    # ... while other maps (another text) over that data file are still refused
    code, _, err = cli(["attention", f"--checkpoint={ckpt}", "--text=A dog.", f"--out={tmp_path / 'a.pdf'}"])
    assert code == 1 and "a.json already exists and holds other data than attention would write" in err
