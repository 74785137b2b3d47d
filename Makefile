# bert_jax: `make demo` runs the main job, `make test` the tests (both install first).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The main job, offline: corpus -> WordPiece vocab -> tiny BERT pretraining -> restore + eval.
demo: install
	$(BIN)/python -m bert_jax.demo demo_out

test: install
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check bert_jax configs tests

bench: install
	$(BIN)/python -m bert_jax.bench data

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache demo_out
