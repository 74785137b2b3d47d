"""The BERT paper's GLUE fine-tuning grids, as sweeps (`bert-jax sweep`).

Variants (`arg`): `<task>[,<size>][,a3]`.
  <task>       Section 4.1: batch 32, 3 epochs, lr in {5e-5, 4e-5, 3e-5, 2e-5}, best on dev.
  <task>,a3    Appendix A.3: batch {16, 32} x lr {5e-5, 3e-5, 2e-5} x epochs {2, 3, 4}.
BERT-Large on small sets was unstable, so the paper also took the best of random restarts:
add seeds with --config.grid.seed='(0, 1, 2, 3, 4)'. Every trial gets `overrides` too:
  bert-jax sweep --config configs/sweeps/glue.py:mrpc --workdir /runs/mrpc_sweep \\
    --config.overrides='("init_from=/ckpt/bert_base", "data.data_dir=/data/glue")'
  (--print_commands prints one `bert-jax train` command per trial for a cluster scheduler.)
"""

from pathlib import Path

import ml_collections

from bert_jax.commands.sweep import PAPER_A3_GRID, sweep_config


def get_config(arg: str = "mrpc") -> ml_collections.ConfigDict:
    parts = arg.split(",")
    task, a3 = parts[0], "a3" in parts[1:]
    size = next((p for p in parts[1:] if p != "a3"), "")
    glue = Path(__file__).resolve().parents[1] / "glue.py"  # works from any directory
    grid = PAPER_A3_GRID if a3 else {"optimizer.learning_rate": (5e-5, 4e-5, 3e-5, 2e-5)}
    return sweep_config(f"{glue}:{task}" + (f",{size}" if size else ""), grid)
