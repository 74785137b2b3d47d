"""The BERT paper's SQuAD fine-tuning grids, as sweeps (`bert-jax sweep`); ranked by dev F1.

Variants (`arg`): `v1` or `v2`, optionally `,<size>` and `,a3`.
  v1      Section 4.2: batch 32, lr 5e-5, 3 epochs; here lr {5e-5, 3e-5} x epochs {2, 3}.
  v2      Section 4.3: batch 48, lr 5e-5, 2 epochs; here lr {5e-5, 3e-5} x epochs {2, 3}.
  ...,a3  Appendix A.3: batch {16, 32} x lr {5e-5, 3e-5, 2e-5} x epochs {2, 3, 4}.
  bert-jax sweep --config configs/sweeps/squad.py:v1 --workdir /runs/squad_sweep \\
    --config.overrides='("init_from=/ckpt/bert_base", "data.data_dir=/data/squad")'
"""

from pathlib import Path

import ml_collections

from bert_jax.commands.sweep import PAPER_A3_GRID, sweep_config


def get_config(arg: str = "v1") -> ml_collections.ConfigDict:
    parts = arg.split(",")
    version, a3 = parts[0], "a3" in parts[1:]
    size = next((p for p in parts[1:] if p != "a3"), "")
    squad = Path(__file__).resolve().parents[1] / "squad.py"  # works from any directory
    grid = PAPER_A3_GRID if a3 else {"optimizer.learning_rate": (5e-5, 3e-5), "train.epochs": (2.0, 3.0)}
    return sweep_config(f"{squad}:{version}" + (f",{size}" if size else ""), grid)
