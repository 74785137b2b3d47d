"""Where the time of a ModernBERT train step goes, ours beside HF's, in one process
(docs/speed.md, "The peer corrected"): the two steps compiled/built on the same
batch (modernbench.bench_config, packed documents; HF's ModernBertForMaskedLM with sdpa and
logits at the masked positions), run in turns, then one profile of each: XLA's thunks by
kind (its trace) and torch's operators (torch.profiler), each as milliseconds a step and
share of the profiled time, and each side's model FLOPs a second.

    XLA_FLAGS=--xla_force_host_platform_device_count=1 OMP_WAIT_POLICY=PASSIVE \
        python benchmarks/modernbert_profile.py SHAPE LENGTH DTYPE [ROUNDS] [OUT.json]

Rates are model FLOPs (the objective's count, the same for both sides) over wall time. The
profiles do not count alike (XLA's trace sums the spans of every thread, torch's the calling
thread's), so only shares within a side are read: the matmul rate of a side is the model
FLOPs over its matmul share of the profiled time times the step's wall time (the model count,
6 x parameters x tokens plus attention, is nearly all matmul).
"""

import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax

from bert_jax.tools import modelbench, modernbench

# XLA:CPU's thunks that hold the matrix products (YNNPACK fusions and plain dots); torch's.
OUR_MATMULS = ("ynn_fusion", "dot")
HF_MATMULS = ("aten::mm", "aten::bmm", "aten::addmm")


def our_ops(step, steps: int) -> dict[str, float]:
    """Milliseconds a step per kind of XLA:CPU thunk (numbered instances summed)."""
    folder = tempfile.mkdtemp(prefix="modernbert_profile_")
    jax.profiler.start_trace(folder)
    step.run(steps)
    jax.profiler.stop_trace()
    [trace] = glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)
    kinds: dict[str, float] = collections.defaultdict(float)
    for e in json.load(gzip.open(trace))["traceEvents"]:
        name = e.get("name", "")
        if e.get("ph") != "X" or "dur" not in e or name.startswith("$") or any(
                s in name for s in ("Execute", "Await", "np.asarray")):
            continue  # Python frames and the executor's own spans, not operations
        kinds[re.sub(r"[.\d]+$", "", name)] += e["dur"] / 1e3 / steps
    return dict(kinds)


def hf_ops(hf, steps: int) -> dict[str, float]:
    """Milliseconds a step per torch operator (self time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        hf.run(steps)
    return {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}


def share(ops: dict[str, float], top: int = 8) -> list[list]:
    total = sum(ops.values())
    return [[k, round(v, 1), round(100 * v / total, 1)]
            for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:top]]


def main(shape: str, length: str, dtype: str, rounds: str = "3", out: str = "") -> None:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    config = modernbench.bench_config(shape, int(length), dtype)
    batch = modelbench.pretraining_batch(config, docs_per_row=4)
    runners = {"ours": modelbench.OurStep(config, batch),
               "hf_sdpa": modernbench.HFModernBert(config, batch, attention="sdpa")}
    for runner in runners.values():
        runner.run(2)
    flops = float(runners["ours"].metrics["flops"])  # model FLOPs a step
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(int(rounds)):
        for name, runner in runners.items():
            c0 = time.process_time()
            seconds[name].append(runner.run(3) / 3)
            cpu[name].append((time.process_time() - c0) / 3)
    ops = {"ours": our_ops(runners["ours"], 3), "hf_sdpa": hf_ops(runners["hf_sdpa"], 3)}
    matmuls = {"ours": OUR_MATMULS, "hf_sdpa": HF_MATMULS}
    result = {"shape": shape, "length": int(length), "dtype": dtype, "flops_per_step": flops,
              "tokens_per_step": int(batch["input_ids"].size)}
    for name in runners:
        step_s = statistics.median(seconds[name])
        mm_ms = sum(v for k, v in ops[name].items() if k in matmuls[name])
        result[name] = {
            "step_s": [round(s, 3) for s in seconds[name]], "cpu_s": [round(c, 3) for c in cpu[name]],
            "model_gflops_per_s": round(flops / step_s / 1e9, 1),
            "matmul_share": round(mm_ms / sum(ops[name].values()), 3),
            "top": share(ops[name])}
        result[name]["matmul_gflops_per_s"] = round(
            flops / (result[name]["matmul_share"] * step_s) / 1e9, 1)
        print(f"{name}: step {step_s:.3f} s (CPU {statistics.median(cpu[name]):.3f} s), "
              f"{result[name]['model_gflops_per_s']} model GFLOP/s; matmuls "
              f"{100 * result[name]['matmul_share']:.0f}% of the profiled time "
              f"({result[name]['matmul_gflops_per_s']} GFLOP/s in them)")
        for kind, ms, pct in result[name]["top"]:
            print(f"    {ms:8.1f} ms {pct:5.1f}%  {kind}")
    print(json.dumps(result))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
