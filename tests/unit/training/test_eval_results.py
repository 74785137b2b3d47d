"""Where `bert-jax eval` puts a split's results, and which numbers it reports: a --split file
of the same name as another one gets its own folder; a loss or metric over no example is none."""

import numpy as np

from bert_jax.training import contrastive, evaluate


def test_split_files_of_one_name_in_two_folders_get_two_result_folders(tmp_path):
    eval_dir, a, b = tmp_path / "eval", tmp_path / "a" / "gs3.tsv", tmp_path / "b" / "gs3.tsv"
    assert evaluate.split_folder(eval_dir, str(a), True) == (eval_dir / "gs3", str(a))
    (eval_dir / "gs3").mkdir(parents=True)
    (eval_dir / "gs3" / evaluate.SPLIT_RECORD).write_text(f"{a}\n")
    assert evaluate.split_folder(eval_dir, str(b), True) == (eval_dir / "gs3-2", str(b))
    assert evaluate.split_folder(eval_dir, str(a), True) == (eval_dir / "gs3", str(a))  # again
    # a split name and a file of that name are two splits too
    (eval_dir / "test").mkdir()
    (eval_dir / "test" / evaluate.SPLIT_RECORD).write_text("test\n")
    assert evaluate.split_folder(eval_dir, "test", False) == (eval_dir / "test", "test")
    assert evaluate.split_folder(eval_dir, f"{tmp_path}/test.tsv", True)[0] == eval_dir / "test-2"


def test_a_result_folder_without_a_record_is_taken_as_the_splits(tmp_path):
    (tmp_path / "eval" / "gs3" / "step_2").mkdir(parents=True)  # written before the records
    assert evaluate.split_folder(tmp_path / "eval", "/x/gs3.tsv", True)[0] == tmp_path / "eval" / "gs3"


def test_a_loss_term_or_metric_over_no_example_is_left_out_not_zero():
    total = {"terms": {"cosent": np.float32(0.0), "mlm": np.float32(6.0)},
             "weights": {"cosent": np.float32(0.0), "mlm": np.float32(3.0)},
             "metrics": {"accuracy": (np.float32(0.0), np.float32(0.0)),
                         "scale": (np.float32(40.0), np.float32(2.0))}}
    assert evaluate._finish(total, "eval/") == {"eval/loss": 2.0, "eval/scale": 20.0}
    total["weights"]["mlm"] = np.float32(0.0)
    assert evaluate._finish(total, "eval/") == {"eval/scale": 20.0}


def test_cosent_counts_no_pair_without_scores():
    objective = contrastive.CoSENT({"name": "bert_embedding", "vocab_size": 32, "emb_dim": 8,
                                    "num_layers": 1, "num_heads": 2, "head_dim": 4, "mlp_dim": 16})
    ids = np.ones((4, 8), np.int32)
    assert float(objective.weights({"query_input_ids": ids})["cosent"]) == 0.0
    scored = objective.weights({"query_input_ids": ids, "score": np.ones(4, np.float32)})
    assert float(scored["cosent"]) == 4.0
