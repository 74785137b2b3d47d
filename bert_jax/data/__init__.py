"""Host-side input that needs no devices: the tokenizer API (tokenizer) and its WordPiece engine
(wordpiece), the data sources by data.name, each a registered class (sources: text,
array_record, tfds, translation, synthetic; `bert-jax prepare`, and `bert-jax vocab`'s input
by its scheme), documents and the original
BERT pretraining-example recipe (documents, pretraining), parallel text (translation),
synthetic batches, fine-tuning batches (finetune), the batch fields and the packers (packing),
malformed task-file rows (rows) and lines of text for a vocabulary (text). It may import only
the base modules (paths, trees, specs); never models, training or anything above: the
training engine turns its output into global batches (training.input).
"""
