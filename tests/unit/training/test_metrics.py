"""metrics.jsonl, TensorBoard event files, console output, peak FLOP/s and MFU."""

import io
import json
import math
import time
from types import SimpleNamespace

import pytest

from bert_jax.training import metrics
from bert_jax.training.metrics import MetricsWriter, mfu, peak_flops_per_device, read_metrics


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def strict_json(line: str) -> dict:
    """json.loads that rejects the NaN/Infinity extensions Python would otherwise accept."""
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(line, parse_constant=reject)


def write_steps(workdir, steps, **kw) -> None:
    with MetricsWriter(workdir, stream=io.StringIO(), **kw) as w:
        for s in steps:
            w.write(s, {"loss": 10.0 - s})


def scalars(workdir, tag) -> list[tuple[int, float]]:
    """The scalars TensorBoard's own reader finds under `tag` in `workdir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(workdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_jsonl_round_trip_with_nonfinite_values(tmp_path):
    row = {"loss": 2.5, "grad_norm": math.nan, "up": math.inf, "down": -math.inf, "tokens": 7}
    with MetricsWriter(tmp_path, stream=io.StringIO()) as w:
        w.write(3, row)
        w.write(4, {"loss": 0.1 + 0.2})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [strict_json(line)["step"] for line in lines] == [3, 4]
    assert strict_json(lines[0])["grad_norm"] == "nan"
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert math.isnan(first.pop("grad_norm"))
    # "time" is rounded to the millisecond: up to 0.5 ms after the clock read here.
    assert time.time() - 60 < first.pop("time") <= second.pop("time") <= time.time() + 1e-3
    assert first == {"step": 3, "loss": 2.5, "up": math.inf, "down": -math.inf, "tokens": 7}
    assert second["loss"] == 0.1 + 0.2  # exact: repr round-trips floats


def test_eval_keys_share_the_file_and_print_an_eval_line(tmp_path):
    out = io.StringIO()
    with MetricsWriter(tmp_path, stream=out, total_steps=20) as w:
        w.write(10, {"loss": 3.0})
        w.write(10, {"eval/loss": 3.1, "eval/accuracy": 0.25})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert {k: v for k, v in rows[1].items() if k != "time"} == {"step": 10, "eval/loss": 3.1,
                                                                  "eval/accuracy": 0.25}
    assert "eval step 10: eval/loss 3.1000  eval/accuracy 0.2500" in out.getvalue()
    assert scalars(tmp_path, "eval/loss") == [(10, pytest.approx(3.1))]


def test_resume_drops_lines_after_the_checkpoint(tmp_path):
    write_steps(tmp_path, range(1, 11))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 11, "lo')  # a write cut short by a crash
    time.sleep(1.05 - time.time() % 1)  # event files sort by their whole-second timestamp
    write_steps(tmp_path, range(7, 9), resume_step=6)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [strict_json(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("metrics")] == ["metrics.jsonl"]
    # Two event files; TensorBoard's reader drops the lost steps 7..10 of the first.
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert scalars(tmp_path, "loss") == [(s, 10.0 - s) for s in range(1, 9)]


def test_resume_at_zero_starts_the_file_over(tmp_path):
    write_steps(tmp_path, [1, 2])
    write_steps(tmp_path, [1], resume_step=0)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_disabled_writer_creates_and_prints_nothing(tmp_path):
    out = io.StringIO()
    with MetricsWriter(tmp_path / "run", enabled=False, stream=out, resume_step=3) as w:
        w.write(1, {"loss": 1.0, "eval/loss": 2.0})
    assert not (tmp_path / "run").exists() and out.getvalue() == ""


def test_tensorboard_reads_the_scalars(tmp_path):
    with MetricsWriter(tmp_path, stream=io.StringIO()) as w:
        for step in (5, 10, 15):
            w.write(step, {"loss": 1.0 / step, "learning_rate": 1e-4})
    assert scalars(tmp_path, "loss") == [(s, pytest.approx(1.0 / s)) for s in (5, 10, 15)]
    assert [v for _, v in scalars(tmp_path, "learning_rate")] == pytest.approx([1e-4] * 3)


def test_plain_console_lines(tmp_path):
    out = io.StringIO()
    with MetricsWriter(tmp_path, stream=out, total_steps=1000) as w:
        w.write(120, {"loss": 3.215, "learning_rate": 1e-4, "tokens_per_sec": 12345.0,
                      "mfu": 0.012, "steps_per_sec": 4.5})
        w.write(1000, {"loss": 3.0, "steps_per_sec": 4.5})
    line, last = out.getvalue().splitlines()
    assert line.startswith("step 120/1000  loss 3.2150  lr 1.00e-04  tokens/s 12,345  mfu 1.2%  eta ")
    assert line.endswith("eta 0:03:16")  # 880 steps at 4.5 steps/s
    assert last == "step 1000/1000  loss 3.0000  eta 0:00:00"


def test_console_lines_show_goodput(tmp_path):
    out, tty = io.StringIO(), FakeTTY()
    for stream in (out, tty):
        with MetricsWriter(tmp_path / str(id(stream)), stream=stream, total_steps=100) as w:
            w.write(50, {"loss": 2.0, "steps_per_sec": 10.0, "goodput": 0.874,
                         "goodput/train_s": 40.0, "goodput/wall_s": 45.8})
    assert out.getvalue().startswith("step 50/100  loss 2.0000  goodput 87%  eta ")
    assert "loss 2.0000  10.00 steps/s  goodput 87%  eta 0:00:05" in tty.getvalue()
    assert "train_s" not in out.getvalue() + tty.getvalue()


def test_tty_progress_bar_redraws_in_place(tmp_path):
    out = FakeTTY()
    with MetricsWriter(tmp_path, stream=out, total_steps=100) as w:
        w.write(50, {"loss": 2.0, "steps_per_sec": 10.0})
        w.write(60, {"loss": 1.5, "steps_per_sec": 10.0})
        assert "\n" not in out.getvalue() and out.getvalue().count("\r") == 2
        w.write(60, {"eval/loss": 1.6})
    text = out.getvalue()
    assert "60/100  loss 1.5000  10.00 steps/s  eta 0:00:04" in text
    assert "\neval step 60: eval/loss 1.6000\n" in text


def test_peak_flops_measured_on_cpu():
    flops, source = peak_flops_per_device()
    assert flops > 1e8 and source == "measured f32 matmul on cpu"
    t0 = time.perf_counter()
    assert peak_flops_per_device() == (flops, source)  # cached for the process
    assert time.perf_counter() - t0 < 0.05


def test_peak_flops_measured_inside_a_mesh(monkeypatch):
    """The training loop asks from inside `jax.set_mesh` over all devices."""
    import jax
    from jax.sharding import AxisType

    monkeypatch.setattr(metrics, "_MEASURED", {})
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    with jax.set_mesh(mesh):
        assert peak_flops_per_device()[0] > 1e8


@pytest.mark.parametrize("kind, flops", [("TPU v5 lite", 197e12), ("TPU v5", 459e12),
                                         ("TPU v6 lite", 918e12), ("NVIDIA H100 80GB HBM3", 989e12),
                                         ("NVIDIA H100 PCIe", 756e12), ("NVIDIA A100-SXM4-40GB", 312e12),
                                         ("NVIDIA B200", 2250e12)])
def test_peak_flops_table(kind, flops):
    got, source = peak_flops_per_device(SimpleNamespace(device_kind=kind, platform="x"))
    assert got == flops and "measured" not in source


def test_mfu_arithmetic():
    # 6e12 model FLOPs in 0.5 s on 4 devices of 10 TFLOP/s peak: 12 of 40 TFLOP/s.
    assert mfu(6e12, 0.5, 4, 10e12) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1, 1.0)
    assert metrics.METRICS_FILE == "metrics.jsonl"
