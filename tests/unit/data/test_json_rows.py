"""A JSON-lines row that is not a JSON object: the decoder's reason whole, with its column."""

import io

import pytest

from bert_jax.data.rows import BadRows, jsonl_rows


@pytest.mark.parametrize("line, reason", [
    ('{"query": "abc", "positive": "de\n', "Unterminated string starting at column 30"),
    ('{"query": }\n', "Expecting value at column 11"),
    ('{"query": "a"} x\r\n', "Extra data at column 16"),
])
def test_a_line_cut_short_names_json_s_reason_and_column(line, reason):
    rows = jsonl_rows(io.StringIO('{"query": "a"}\n' + line), BadRows("p.jsonl", False, ValueError))
    said = f"^p.jsonl:2: line: found .*, expected a JSON object \\({reason}\\)"
    with pytest.raises(ValueError, match=said):
        list(rows)
