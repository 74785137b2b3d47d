"""Translation with the encoder-decoder: greedy and beam search with the key/value cache on
the mesh (decode), BLEU (bleu), and the `translate` command plus the evaluator that adds dev
BLEU to a translation run (translate). It may import training, models, data, config and the
base modules; training reaches its evaluator only by name (training.evaluate.EVALUATORS).
"""
