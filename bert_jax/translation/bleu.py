"""BLEU of translations against references: sacreBLEU's standard score on detokenized text
(what WMT reports today), and the tokenized, compound-split BLEU of the Transformer paper
(tensor2tensor's get_ende_bleu.sh), which reads a point or so higher on newstest2014 En-De
and is not comparable with sacreBLEU."""

from __future__ import annotations

import re
from typing import Any

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from bert_jax.data.documents import read_lines  # noqa: F401 (bleu.read_lines: the files scored)

TOKENIZED_LABEL = ("tokenized BLEU (13a tokens, compound-split ##AT##-##AT##, as tensor2tensor's "
                   "get_ende_bleu.sh): comparable to the Transformer paper's 27.3 / 28.4 En-De, not "
                   "to sacreBLEU")

# get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, as re.sub).
_COMPOUND = re.compile(r"(\S)-(\S)")


def _check_pair(hypotheses: list[str], references: list[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypothesis lines but {len(references)} reference "
                         "lines; BLEU needs one hypothesis per reference line (same file order)")
    if not hypotheses:
        raise ValueError("no lines to score: the hypothesis and reference lists are empty")


def _score(bleu: BLEU, hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU's corpus score with its parts, as JSON-serialisable values."""
    s = bleu.corpus_score(hypotheses, [references])
    return {"bleu": float(s.score), "signature": str(bleu.get_signature()),
            "brevity_penalty": float(s.bp), "length_ratio": float(s.sys_len / max(s.ref_len, 1)),
            "hyp_len": int(s.sys_len), "ref_len": int(s.ref_len),
            "precisions": [float(p) for p in s.precisions], "lines": len(hypotheses)}


def corpus_bleu(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU's standard BLEU (13a tokens, cased, exp smoothing, one reference) of
    detokenized text: {"bleu", "signature", "brevity_penalty", "length_ratio", ...}."""
    _check_pair(hypotheses, references)
    return {**_score(BLEU(tokenize="13a"), hypotheses, references), "label": "sacreBLEU"}


def split_compounds(line: str) -> str:
    """`Test-Ergebnis` -> `Test ##AT##-##AT## Ergebnis`, as get_ende_bleu.sh does."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """The Transformer paper's BLEU (tensor2tensor get_ende_bleu.sh): both sides tokenized,
    compounds split, then multi-bleu.perl on those tokens. sacreBLEU's 13a tokenizer stands
    in for the Moses tokenizer (they differ on a few apostrophes and escapes, and 13a splits
    a hyphen after a digit, "1990-2000", which Moses keeps for the compound split), and
    smoothing is off, as in multi-bleu.perl."""
    _check_pair(hypotheses, references)
    tokenize = Tokenizer13a()
    hyp = [split_compounds(tokenize(h.strip())) for h in hypotheses]
    ref = [split_compounds(tokenize(r.strip())) for r in references]
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)  # force: input is tokenized
    return {**_score(bleu, hyp, ref), "label": TOKENIZED_LABEL}
