"""`bert-jax translate`: a text file through an encoder-decoder checkpoint, scored given a reference."""

from __future__ import annotations

import json

from bert_jax.commands.options import (
    ALPHA,
    BATCH_SIZE,
    BEAM,
    CHECKPOINT,
    INPUT,
    OUTPUT,
    REFERENCE,
    maybe_initialize_distributed,
    require,
)


def cmd_translate(args: list[str]) -> None:
    """Translates a text file with an encoder-decoder checkpoint; scores it given a reference."""
    from bert_jax.translation import translate

    maybe_initialize_distributed("translate")  # on a pod every host runs this; they decode together
    report = translate.translate_file(
        require(CHECKPOINT, "translate"), require(INPUT, "translate"),
        require(OUTPUT, "translate"), beam_size=BEAM.value, alpha=ALPHA.value,
        batch_size=BATCH_SIZE.value, reference=REFERENCE.value)
    if "sacrebleu" in report:
        print(f"sacreBLEU {report['sacrebleu']['bleu']:.2f} ({report['sacrebleu']['signature']})\n"
              f"tokenized BLEU {report['tokenized_bleu']['bleu']:.2f} (compound-split, the "
              "paper's convention: compare with its 27.3 / 28.4, not with sacreBLEU)")
    print(json.dumps(report))
