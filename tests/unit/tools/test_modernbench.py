"""The HF peer that `bench modernbert` trains beside ours."""

import pytest

from bert_jax import config as config_lib
from bert_jax.paths import REPO


def test_the_hf_peer_drops_attention_probabilities_at_our_rate_not_the_outputs():
    """The published recipe drops the attention output (0.1) and not the probabilities (0);
    HF has one rate for both, and the peer takes the probabilities' (export writes the larger)."""
    pytest.importorskip("transformers")
    from bert_jax.tools import modernbench

    config = config_lib.load(str(REPO / "configs/modernbert.py:mini"), [])
    assert config.model.attention_dropout_rate == 0.0
    assert config.model.attention_output_dropout_rate == 0.1
    peer = modernbench.hf_peer_config(config, {"pad": 0, "cls": 1, "sep": 2})
    assert peer.attention_dropout == 0.0 and peer.sparse_prediction
    raised = config_lib.load(str(REPO / "configs/modernbert.py:mini"),
                             ["model.attention_dropout_rate=0.05"])
    assert modernbench.hf_peer_config(raised, {"pad": 0, "cls": 1, "sep": 2}).attention_dropout == 0.05
