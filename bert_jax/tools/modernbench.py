"""`python -m bert_jax.tools.bench modernbert`: our ModernBERT train step beside Hugging Face's
`ModernBertForMaskedLM` in PyTorch, on this machine, interleaved (docs/speed.md#modernbert-beside-hf).

Ours: the published config (configs/modernbert.py) at a shape, `model.attention_kernel=xla`
(the CPU's), packed documents (4 per row), 30% of each row's tokens predicted, the real train
step (StableAdamW). HF's: the same model as our `export` writes its config.json (our config ->
families.get("modernbert").config_to_hf), random weights, AdamW, logits at the masked
positions only (`sparse_prediction`, as ours), attention dropout at our probabilities' rate
(hf_peer_config), one sequence per row (its sdpa and eager paths
have no segment ids; the unpadded path needs flash-attn, which has no CPU build), in each
attention implementation asked for, and `torch.compile`d where asked. Both get the same ids
and masked positions, one device, the machine's threads. Runs alternate (ours, each HF
variant, ours, ...) `repeats` times, `steps` steps each after a warm-up, so that a busy
machine slows all alike; each ratio's median and range over the repeats is reported.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.paths import REPO

HF_VARIANTS = ("sdpa", "eager", "sdpa+compile")
# (config, tokens per step) of each shape: rows = tokens // tokens per row
SHAPES = {"mini": ("configs/modernbert.py:mini", 4096), "base": ("configs/modernbert.py:base", 1024)}


def hf_peer_config(config, special_ids: dict[str, int]):
    """transformers' ModernBertConfig for the peer that trains beside ours: our model as
    `export` writes it (families.get("modernbert").config_to_hf), logits at the masked positions
    only (`sparse_prediction`, as ours), and HF's one `attention_dropout` (it drops both the
    attention probabilities and the attention output) at our probabilities' rate: export
    writes the larger of our two rates, which for the published recipe (0.1 on the output, 0 on
    the probabilities) had HF draw a dropout mask over every [rows, heads, T, T] probability
    that ours never draws (HF's largest operator at 1,024 tokens, 29% of its step on this CPU:
    benchmarks/results/modernbert_profile_mini_1024_hf_dropout_both.json). The output dropout
    it then lacks is one mask over [rows, T, width] a layer."""
    import transformers

    from bert_jax.interop import families

    cfg = models.split_model_config(config_lib.model_config(config))[1]
    hf = families.get("modernbert").config_to_hf(config.model.name, cfg, special_ids)
    hf["attention_dropout"] = cfg.attention_dropout_rate
    hf_config = transformers.ModernBertConfig(**{k: v for k, v in hf.items() if k != "architectures"})
    hf_config.sparse_prediction = True
    return hf_config


class HFModernBert:
    """HF's ModernBertForMaskedLM made from our `config`'s model (random weights) training on
    `batch` (our pretraining batch: its ids, masked positions and labels) with AdamW."""

    def __init__(self, config, batch: dict[str, np.ndarray], *, attention: str = "sdpa",
                 compile: bool = False, device: str | None = None):
        import torch
        import transformers

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.bfloat16 if config.dtype == "bfloat16" else None
        hf_config = hf_peer_config(config, {"pad": 0, "cls": 1, "sep": 2})
        hf_config._attn_implementation = attention
        model = transformers.ModernBertForMaskedLM(hf_config).to(self.device)
        self.model = torch.compile(model) if compile else model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.ids = torch.as_tensor(batch["input_ids"], dtype=torch.long, device=self.device)
        self.labels = torch.full_like(self.ids, -100)
        at = torch.as_tensor(batch["masked_lm_positions"], dtype=torch.long, device=self.device)
        self.labels.scatter_(1, at, torch.as_tensor(batch["masked_lm_ids"], dtype=torch.long,
                                                    device=self.device))
        self.mask = torch.ones_like(self.ids)
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}

    def _step(self):
        with self.torch.autocast(self.device, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.model(input_ids=self.ids, attention_mask=self.mask, labels=self.labels).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def run(self, steps: int) -> float:
        """Seconds of `steps` steps, the last one finished."""
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = self._step()
        float(loss.detach())  # waits for the last step
        return time.perf_counter() - t0

    @property
    def tokens(self) -> int:
        return self.ids.numel()


def bench_config(shape: str, length: int, dtype: str, extra: tuple[str, ...] = ()):
    """The published `shape` at `length` tokens per row on this machine's kernel (xla), its
    rows a step: SHAPES' tokens over `length` (`extra`: more overrides)."""
    path, tokens = SHAPES[shape]
    return config_lib.load(str(REPO / path), [
        "data.phases=()", "schedule.stages=()", f"dtype={dtype}", "model.attention_kernel=xla",
        f"data.max_seq_length={length}", f"data.max_predictions_per_seq={round(0.3 * length)}",
        f"train.batch_size={max(1, tokens // length)}", "mesh.data=-1",
        "train.grad_accum_steps=1", *extra])


def compare(shape: str, length: int, dtype: str, *, variants=HF_VARIANTS, repeats: int = 5,
            steps: int = 3, extra: tuple[str, ...] = ()) -> dict:
    """Tokens/s of ours and of each HF variant over `repeats` interleaved runs; each ratio
    (ours / variant) per repeat, with its median and range."""
    import torch

    from bert_jax.tools import modelbench

    torch.set_num_threads(os.cpu_count() or 1)
    config = bench_config(shape, length, dtype, extra)
    batch = modelbench.pretraining_batch(config, docs_per_row=4)
    runners = {"ours": modelbench.OurStep(config, batch)}
    tokens = {"ours": batch["input_ids"].size}
    for variant in variants:
        attention, _, compiled = variant.partition("+")
        runners[variant] = HFModernBert(config, batch, attention=attention, compile=bool(compiled))
        tokens[variant] = runners[variant].tokens
    for runner in runners.values():  # warm-up: allocators, thread pools, torch.compile
        runner.run(2)
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            rates[name].append(tokens[name] * steps / runner.run(steps))
    out = {"shape": shape, "tokens_per_row": length, "rows": config.train.batch_size,
           "dtype": dtype, "repeats": repeats, "steps": steps,
           "tokens_per_s": {k: statistics.median(v) for k, v in rates.items()}, "runs": rates,
           "ratios": {}}
    for variant in variants:
        ratios = [a / b for a, b in zip(rates["ours"], rates[variant], strict=True)]
        out["ratios"][variant] = {"median": statistics.median(ratios), "min": min(ratios),
                                  "max": max(ratios)}
    out["versions"] = runners[variants[0]].versions if variants else {}
    return out


def table(results: list[dict]) -> str:
    lines = ["| shape | tokens/row | rows | dtype | ours tokens/s | " + " | ".join(
        f"HF {v} tokens/s | ours/{v} (median [range])" for v in HF_VARIANTS) + " |",
        "|---|---:|---:|---|---:|" + "---:|---|" * len(HF_VARIANTS)]
    for r in results:
        cells = []
        for v in HF_VARIANTS:
            if v in r["ratios"]:
                q = r["ratios"][v]
                cells += [f"{r['tokens_per_s'][v]:,.0f}",
                          f"{q['median']:.2f}x [{q['min']:.2f}, {q['max']:.2f}]"]
            else:
                cells += ["-", "-"]
        lines.append(f"| {r['shape']} | {r['tokens_per_row']:,} | {r['rows']} | {r['dtype']} | "
                     f"{r['tokens_per_s']['ours']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
