"""Defaults live with their owners, not where a value is read: a `.get("key", default)` on a run
config (or one of its sections) restates a default. The library's remaining ones are counted
per file below; a new one fails, and so does a count that fell without lowering its entry (the
list only shrinks). Configs saved by older versions get their missing keys once, at the command
boundary (config.complete), so readers below it use plain attributes."""

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "bert_jax"

# Receivers that hold a run config or a section of one, by the names the library gives them.
CONFIG_NAMES = {"config", "cfg", "data", "d", "t", "model_cfg", "phase_cfg", "schedule_cfg"}
SECTIONS = {"config", "data", "train", "model", "optimizer", "schedule", "decode", "mesh"}

# file -> how many such reads it still has. Lower an entry when you remove one; never raise it.
REMAINING = {
    "config.py": 1,  # model_config: the compute dtype of a model section saved with its own
    "commands/cloud.py": 2,  # the command layer: `info` on a config of any kind
    "training/checkpoint.py": 2,  # comparing a stored config, which may lack sections
    "translation/translate.py": 1,  # a stored config, which may lack a data section
    "viz/attention_maps.py": 1,  # a stored config, which may lack a data section
    "viz/plots.py": 1,  # likewise
    "interop/export.py": 1,  # a Transformer has no hf_family (hf_config then refuses it)
    # Not run configs: Hugging Face's JSON files, read as the library that wrote them does.
    "data/wordpiece.py": 3,
}


def _is_config(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES
    return isinstance(node, ast.Attribute) and node.attr in SECTIONS


def config_reads_with_default(path: Path) -> list[str]:
    """`x.get("key", default)` calls on config-like receivers in `path`, as source text."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and len(node.args) == 2
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and _is_config(node.func.value)):
            name = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_new_config_read_restates_a_default():
    counts, lines = {}, []
    for path in sorted(PACKAGE.rglob("*.py")):
        found = config_reads_with_default(path)
        if found:
            counts[str(path.relative_to(PACKAGE))] = len(found)
            lines += found
    grown = {f: n for f, n in counts.items() if n > REMAINING.get(f, 0)}
    assert not grown, ("new .get(key, default) reads of a run config (read the attribute: the "
                       "default belongs to the config's owner, config.complete fills old configs):\n"
                       + "\n".join(line for line in lines if line.split(":")[0] in grown))
    shrunk = {f: (n, counts.get(f, 0)) for f, n in REMAINING.items() if counts.get(f, 0) < n}
    assert not shrunk, f"lower these REMAINING entries to what is left: {shrunk}"


def test_the_scan_sees_a_config_read(tmp_path):
    """The scanner catches the forms it is meant to (and not a one-argument get)."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(config, d, x):\n"
                     "    a = config.train.get('steps', 1)\n"
                     "    b = d.get('pack', False)\n"
                     "    c = x.get('pack', False)\n"
                     "    e = config.get('seed')\n")
    found = config_reads_with_default(probe)
    assert [line.split(": ", 1)[1] for line in found] == ["config.train.get('steps', 1)",
                                                           "d.get('pack', False)"]
