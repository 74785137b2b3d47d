"""Our ModernBERT train step, two ways in one process, runs alternating (docs/speed.md,
"Where our step's time goes"): how the before/after numbers of the banded local windows
were measured on a shared CPU.

    python benchmarks/modernbert_ab.py SHAPE LENGTH DTYPE REPEATS STEPS VARIANT [VARIANT ...]

VARIANT is `name|overrides|attention`: overrides a comma-separated list of config overrides
(e.g. model.scan_layers=false), attention `band` (today's xla kernel: local windows much
shorter than the row banded, one scanned step per period of the global layers) or `dense`
(as before: every local layer over all keys under the dense mask, a scan over single layers).
Each variant's step is compiled (modernbench.bench_config: packed documents, the real train
step); then REPEATS rounds of STEPS steps of each in turn. Prints, per variant, tokens/s
(median [range]) and its ratio to the first variant per round, the process CPU seconds
per step and the minor page faults per step (both far less sensitive to other jobs than
wall time), and one JSON line with every run.
"""

import json
import os
import resource
import statistics
import sys
import time

from bert_jax.models import transformer
from bert_jax.models.kernels import xla
from bert_jax.tools import modelbench, modernbench


def build(shape: str, length: int, dtype: str, overrides: str, attention: str):
    band_block, period = xla.band_block, transformer.Stack._period
    if attention == "dense":  # the computation before banding, patched while tracing only
        xla.band_block = lambda *_: None
        transformer.Stack._period = lambda *_: 1
    try:
        config = modernbench.bench_config(shape, length, dtype,
                                          tuple(x for x in overrides.split(",") if x))
        batch = modelbench.pretraining_batch(config, docs_per_row=4)
        return modelbench.OurStep(config, batch), batch["input_ids"].size
    finally:
        xla.band_block, transformer.Stack._period = band_block, period


def main(shape, length, dtype, repeats, steps, *variants):
    length, repeats, steps = int(length), int(repeats), int(steps)
    runners = {}
    for v in variants:
        name, overrides, attention = v.split("|")
        runners[name] = build(shape, length, dtype, overrides, attention)
    for step, _ in runners.values():
        step.run(1)
    runs = {n: {"tokens_per_s": [], "cpu_s": [], "minor_faults": []} for n in runners}
    for _ in range(repeats):
        for n, (step, tokens) in runners.items():
            c0, f0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            runs[n]["tokens_per_s"].append(tokens * steps / step.run(steps))
            runs[n]["cpu_s"].append((time.process_time() - c0) / steps)
            runs[n]["minor_faults"].append(
                (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps)
    first = runs[next(iter(runs))]["tokens_per_s"]
    for n, r in runs.items():
        rate, ratio = r["tokens_per_s"], [a / b for a, b in zip(r["tokens_per_s"], first)]
        print(f"{n}: {statistics.median(rate):,.0f} tokens/s [{min(rate):,.0f}, {max(rate):,.0f}]"
              f", ratio {statistics.median(ratio):.2f} [{min(ratio):.2f}, {max(ratio):.2f}]"
              f", CPU s/step {statistics.median(r['cpu_s']):.2f}"
              f" [{min(r['cpu_s']):.2f}, {max(r['cpu_s']):.2f}]"
              f", minor faults/step {statistics.median(r['minor_faults']):,.0f}")
    print(json.dumps({"shape": shape, "tokens_per_row": length, "dtype": dtype, "steps": steps,
                      "variants": list(variants), "runs": runs, "load": os.getloadavg()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
