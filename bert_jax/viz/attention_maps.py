"""`bert-jax attention`: the attention probabilities of every layer and head for one input,
as a figure (a grid of heatmaps, one head larger), a self-contained interactive HTML page
(pick the map, layer and head; no server, no downloads) and JSON data.

The probabilities are the model's own: every model's `attention_out` dict receives what each
attention layer's softmax produced (the same values its output is computed from). BERT models
show their self-attention over [CLS] A [SEP] (B [SEP]); an encoder-decoder translates the
text (greedy) and shows its cross-attention (target x source), with the encoder's and
decoder's self-attention in the HTML view; a decoder-only LM shows its causal self-attention.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.models.transformer import DecoderLM, EncoderDecoder
from bert_jax.paths import workdir_path
from bert_jax.training import checkpoint, objectives
from bert_jax.training import state as state_lib
from bert_jax.translation import decode
from bert_jax.viz import plots

OUTPUTS = (".png", ".svg", ".pdf", ".html")

log = logging.getLogger(__name__)


def _warn_if_cut(tokens: int, max_len: int, requested: int, table: int | None) -> None:
    """Says when the input (`tokens` long, special tokens included) is cut to max_len."""
    if tokens <= max_len:
        return
    advice = ("the model takes no more" if max_len == table else
              "raise --max_seq_length to see more" + (f" (up to {table})" if table else ""))
    log.warning(f"warning: --text: the input is {tokens} tokens; the maps show its first {max_len} "
                f"(--max_seq_length={requested}); {advice}")


def compute(checkpoint_dir: str, text: str, pair: str | None = None, *, step: int | None = None,
            max_len: int = 128, layer: int = -1, head: int = 0) -> dict[str, Any]:
    """{"model", "checkpoint", "step", "text", "pair", "maps": {name: {"queries": tokens,
    "keys": tokens, "probs": [L, N, T, S] float32}}, "default_map"} for one input (`layer`
    and `head`, the ones to draw large, are checked before the model runs)."""
    _check_text(text, "--text", "the sentence to look at, e.g. --text 'The cat sat.'")
    if pair is not None:  # given empty, it would be an empty segment B: [CLS] A [SEP] [SEP]
        _check_text(pair, "--pair", "the second sentence (segment B), or leave --pair out")
    step = checkpoint.resolve_step(checkpoint_dir, step)
    config = checkpoint.read_config(checkpoint_dir, step)
    model_cfg = config["model"]
    name, fields = models.split_model_config(model_cfg)
    cls = models.MODELS[name]  # what the model is decides what to show, not its name
    seq2seq, lm = issubclass(cls, EncoderDecoder), issubclass(cls, DecoderLM)
    layers = (fields.num_decoder_layers or fields.num_layers) if seq2seq else fields.num_layers
    _check_choice(layer, head, layers, fields.num_heads)  # before the (slow) model load
    if max_len < 3:
        raise ValueError(f"--max_seq_length={max_len} leaves no room for [CLS] A [SEP] B [SEP]")
    requested = max_len
    if fields.max_positions is not None:
        max_len = min(max_len, fields.max_positions)  # a longer text is cut to the position table
    if pair is not None and (seq2seq or lm):
        raise ValueError(f"--pair: model.name={name!r} takes one text (--text), not a pair")
    tokenizer = tokenizer_lib.checkpoint_tokenizer(checkpoint_dir,
                                                   config.get("data", {}).get("tokenizer", ""))
    tokenizer.check_fits(fields.vocab_size, f"the model in {checkpoint_dir}")
    _, model = state_lib.load_model(checkpoint_dir, step, model_cfg)
    graphdef, params = nnx.split(model)
    # The checkpoint as one name however it was typed (runs/x, runs/x/, its absolute path): the
    # data file of one run's maps holds the same bytes for each figure format (check_new_file).
    where = str(checkpoint_dir)
    where = where.rstrip("/") if paths.is_remote(where) else os.path.abspath(where)
    out: dict[str, Any] = {"model": name, "checkpoint": where, "step": step,
                           "text": text, "pair": pair, "max_seq_length": max_len, "maps": {}}
    if not (seq2seq or lm):  # BERT: the encoder's self-attention over [CLS] A [SEP] (B [SEP])
        enc = tokenizer.encode_pair(text, pair, max_len)
        _warn_if_cut(len(tokenizer.encode_pair(text, pair).input_ids), max_len, requested,
                     fields.max_positions)

        @jax.jit
        def run(params, ids, types):
            m, found = nnx.merge(graphdef, params), {}
            for attr in models.encoder_path(name):  # a task model's BERT encoder
                m = getattr(m, attr)
            m(ids, types, jnp.ones_like(ids), attention_out=found)
            return found["encoder"]

        probs = run(params, jnp.asarray([enc.input_ids]), jnp.asarray([enc.token_type_ids]))
        if fields.attention_pattern == "linformer":  # its keys are projections, not the tokens
            projections = [f"proj {j}" for j in range(probs.shape[-1])]
            out["maps"]["self-attention"] = _map(enc.tokens, projections, probs, LINFORMER_KEYS)
        else:
            out["maps"]["self-attention"] = _map(enc.tokens, enc.tokens, probs)
        out["default_map"] = "self-attention"
    elif seq2seq:
        ids = tokenizer.encode(text)
        _warn_if_cut(len(ids) + 1, max_len, requested, fields.max_positions)  # with its EOS
        src = np.append(ids[:max_len - 1], tokenizer.sep_id)[None].astype(np.int32)
        banned = tuple(sorted({tokenizer.cls_id, tokenizer.mask_id} - {tokenizer.sep_id}))

        @jax.jit
        def translate(params, src):
            return decode.greedy_search(nnx.merge(graphdef, params), src, eos_id=tokenizer.sep_id,
                                        banned_ids=banned)

        hyp = np.asarray(translate(params, jnp.asarray(src)))[0]
        stop = np.flatnonzero(hyp == tokenizer.sep_id)
        tgt = hyp[:stop[0] + 1] if len(stop) else hyp[hyp != 0]  # with its EOS when produced

        @jax.jit
        def run(params, src, tgt):
            found: dict = {}
            ones = jnp.ones_like(tgt)  # one target sequence: its start token (0) is not padding
            nnx.merge(graphdef, params)(src, objectives.shift_right(tgt, ones), tgt_segments_BT=ones,
                                        attention_out=found)
            return found

        found = run(params, jnp.asarray(src), jnp.asarray(tgt[None]))
        source, target = tokenizer.tokens(src[0]), tokenizer.tokens(tgt)
        # Decoder query i produces target token i having read the inputs (start), t_1..t_i-1.
        inputs = ["(start)", *target[:-1]]
        out["translation"] = tokenizer.decode(tgt[tgt != tokenizer.sep_id])
        out["maps"] = {"cross-attention": _map(target, source, found["cross"]),
                       "encoder self-attention": _map(source, source, found["encoder"]),
                       "decoder self-attention": _map(target, inputs, found["decoder"])}
        out["default_map"] = "cross-attention"
    else:
        ids = tokenizer.encode(text)
        _warn_if_cut(len(ids), max_len, requested, fields.max_positions)
        ids = ids[:max_len].astype(np.int32)

        @jax.jit
        def run(params, ids):
            found: dict = {}
            nnx.merge(graphdef, params)(ids, attention_out=found)
            return found["decoder"]

        tokens = tokenizer.tokens(ids)
        out["maps"]["causal self-attention"] = _map(tokens, tokens, run(params, jnp.asarray(ids[None])))
        out["default_map"] = "causal self-attention"
    return out


def _check_text(value: str, flag: str, give: str) -> None:
    """A text flag given empty or blank: an error naming it (`give`: what to give instead)."""
    if not value.strip():
        raise ValueError(f"{flag} is empty: give {give}")


KEY_AXIS = "key (attended to)"
# Linformer attends to linformer_k learned mixes of every token's key and value
# (models/attention.py), so its key axis names projections, never tokens.
LINFORMER_KEYS = "linformer projection (a learned mix of every token's key)"


def _map(queries: list[str], keys: list[str], probs_LBNTS, key_axis: str = KEY_AXIS
         ) -> dict[str, Any]:
    """One map's labels and probabilities [L, N, T, S]; labels that do not match the axes
    they name are an error, not a picture that mislabels them."""
    probs = np.asarray(probs_LBNTS, np.float32)[:, 0]  # the one input: [L, N, T, S]
    if probs.shape[-2:] != (len(queries), len(keys)):
        raise ValueError(f"attention maps of {probs.shape[-2]} queries x {probs.shape[-1]} keys "
                         f"cannot be labelled with {len(queries)} x {len(keys)} names; this "
                         "model's attention is not one the picture can show")
    return {"queries": list(queries), "keys": list(keys), "key_axis": key_axis, "probs": probs}


def figure(result: dict[str, Any], *, layer: int = -1, head: int = 0, map_name: str | None = None):
    """Every layer (rows) and head (columns) of one map as small heatmaps (tokens on the
    outer axes when readable), and the chosen head larger with the tokens on both axes.
    Each heatmap's colours run from 0 to that head's largest probability (the large one
    has a colour bar)."""
    name = map_name or result["default_map"]
    m = result["maps"][name]
    probs, queries, keys = m["probs"], m["queries"], m["keys"]
    L, N = probs.shape[:2]
    layer, head = _check_choice(layer, head, L, N)
    # Tokens on the grid's outer axes too when they can be read (a few heads, a sentence);
    # a BERT-Base grid (144 heads) shows them on the large heatmap and in the HTML page.
    labelled = L * N <= 16 and max(len(keys), len(queries)) <= 40
    cell = max(1.5, 0.11 * max(len(keys), len(queries))) if labelled else 0.8
    margin = 0.07 * max(len(t) for t in [*keys, *queries]) + 0.3 if labelled else 0.0
    grid_w, grid_h = cell * N + 0.5 + margin, cell * L + 0.6 + margin
    big_w = max(5.0, 0.24 * len(keys) + 2.5)
    height = max(grid_h, 0.24 * len(queries) + 2.2, 4.5) + 0.8
    fig = plots.new_figure(figsize=(grid_w + big_w, height))
    left, right = fig.subfigures(1, 2, width_ratios=[grid_w, big_w], wspace=0.02)
    axes = left.subplots(L, N, squeeze=False)
    for li in range(L):
        for hi in range(N):
            ax, p = axes[li, hi], probs[li, hi]
            ax.imshow(p, cmap="Blues", vmin=0, vmax=max(float(p.max()), 1e-9),
                      interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if (li, hi) == (layer, head):
                for spine in ax.spines.values():
                    spine.set_color("tab:red")
                    spine.set_linewidth(2.5)
            if li == 0:
                ax.set_title(f"head {hi}", fontsize=8)
            if hi == 0:
                ax.set_ylabel(f"layer {li}", fontsize=8)
            if labelled and li == L - 1:
                ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=5)
            if labelled and hi == 0:
                ax.set_yticks(range(len(queries)), queries, fontsize=5)
    left.supxlabel("every layer and head (each from 0 to its max)", fontsize=9)
    big = right.subplots()
    im = big.imshow(probs[layer, head], cmap="Blues", vmin=0, interpolation="nearest")
    big.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
    big.set_yticks(range(len(queries)), queries, fontsize=8)
    big.set_xlabel(m.get("key_axis", KEY_AXIS))
    big.set_ylabel("query (attending)")
    big.set_title(f"layer {layer}, head {head}", fontsize=10)
    right.colorbar(im, ax=big, fraction=0.046, pad=0.02, label="attention probability")
    title = f"{name}: {result['model']} ({L} layers x {N} heads)"
    if "translation" in result:
        title += (f"\nsource: {_cut(result['text'])}\ngreedy translation: "
                  f"{_cut(result['translation'])}")
    fig.suptitle(title, fontsize=10, y=1.0, parse_math=False)
    return fig


def _cut(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _check_choice(layer: int, head: int, L: int, N: int) -> tuple[int, int]:
    if not -L <= layer < L:
        raise ValueError(f"--layer={layer} is out of range for {L} layers (use -{L}..{L - 1})")
    if not -N <= head < N:
        raise ValueError(f"--head_index={head} is out of range for {N} heads (use -{N}..{N - 1})")
    return layer % L, head % N


def data_json(result: dict[str, Any], decimals: int = 4) -> dict[str, Any]:
    """The result as JSON-ready data (probabilities rounded to `decimals`)."""
    return {**{k: v for k, v in result.items() if k != "maps"},
            "maps": {name: {"queries": m["queries"], "keys": m["keys"],
                            "key_axis": m.get("key_axis", KEY_AXIS),
                            "shape": ["layer", "head", "query", "key"],
                            "probs": np.round(m["probs"].astype(np.float64), decimals).tolist()}
                     for name, m in result["maps"].items()}}


def html_page(result: dict[str, Any], *, layer: int = -1, head: int = 0) -> str:
    """A self-contained page: choose map, layer and head; every head of the layer as
    thumbnails (click one), the chosen head as a table of probabilities colored by value."""
    data = data_json(result, decimals=3)
    first = result["maps"][result["default_map"]]["probs"]
    layer, head = _check_choice(layer, head, *first.shape[:2])
    title = f"Attention of {result['model']}: {result['text']}" + (
        f" ||| {result['pair']}" if result.get("pair") else "")
    payload = json.dumps({"data": data, "layer": layer, "head": head, "map": result["default_map"]})
    # Inside <script>, no '<', '>' or '&' of the text may close or comment the element.
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    page = (Path(__file__).parent / "attention_page.html").read_text(encoding="utf-8")
    fill = {"TITLE": html.escape(title), "DATA": payload}
    return re.sub(r"\{\{(TITLE|DATA)\}\}", lambda m: fill[m.group(1)], page)  # one pass


def write(result: dict[str, Any], out: str, *, layer: int = -1, head: int = 0) -> dict[str, str]:
    """Writes `out` (.html, or a .png/.svg/.pdf figure) and its data (.json beside it)."""
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in OUTPUTS:
        raise ValueError(f"--out={out}: the file name must end in one of {list(OUTPUTS)}")
    if suffix == ".html":
        plots.write_bytes(out, html_page(result, layer=layer, head=head).encode())
    else:
        plots.save_figure(figure(result, layer=layer, head=head), out)
    data = plots.write_data(plots.data_path(out, ".json"), data_bytes(result))
    return {"figure" if suffix != ".html" else "html": out, "data": data}


def data_bytes(result: dict[str, Any]) -> bytes:
    """What a figure's .json data file holds."""
    return json.dumps(data_json(result)).encode()


def attention(checkpoint_dir: str, text: str, pair: str | None = None, *, out: str | None = None,
              layer: int = -1, head: int = 0, step: int | None = None, max_len: int = 128
              ) -> dict[str, Any]:
    """`bert-jax attention`: writes `out`, or by default both <checkpoint>/plots/attention.png
    and .html (each with its .json data)."""
    for path in [out] if out else []:
        if os.path.splitext(path)[1].lower() not in OUTPUTS:
            raise ValueError(f"--out={path}: the file name must end in one of {list(OUTPUTS)}")
        # (the default, plots/ of the checkpoint, is attention's own: drawn again)
        paths.check_new_file(path, "--out", "attention")  # (its data file: below)
    result = compute(checkpoint_dir, text, pair, step=step, max_len=max_len, layer=layer, head=head)
    if out:  # a data file holding these very maps: the same figure in another format
        data = plots.data_path(out, ".json")
        paths.check_new_file(out, "--out", "attention", [data], {data: data_bytes(result)})
    default = str(workdir_path(checkpoint_dir) / "plots" / "attention")
    outs = [out] if out else [default + ".png", default + ".html"]
    shown = result["maps"][result["default_map"]]
    tokens = shown["keys"] if shown.get("key_axis", KEY_AXIS) == KEY_AXIS else shown["queries"]
    report: dict[str, Any] = {"model": result["model"], "maps": list(result["maps"]), "tokens": tokens}
    if "translation" in result:
        report["translation"] = result["translation"]
    for path in outs:
        report.update(write(result, path, layer=layer, head=head))
    return report
