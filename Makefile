# bert_jax: `make demo` runs the main job, `make test` the tests (both install first);
# `make test-quick` the quick tier (unit and integration tests not marked slow; docs/testing.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-quick lint bench peers-env bench-mt plan-paper clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The main job, offline: corpus -> WordPiece vocab -> tiny BERT pretraining -> restore + eval.
demo: install
	$(BIN)/python -m bert_jax.tools.demo demo_out

# Two pytest-xdist workers, a test module each at a time (docs/testing.md): one compiles while
# the other runs. TEST_WORKERS=0: all in this one process.
TEST_WORKERS ?= 2
PYTEST := XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python -m pytest -q \
	-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# Everything (tests/unit, tests/integration, tests/e2e), in two runs: the tests not marked slow
# (tiny models, compiled faster at XLA's -O0, which tests/conftest.py sets for -m "not slow"),
# then the slow ones (XLA's default optimisation, under which long trainings run twice as
# fast). Non-zero if either run fails.
test: install
	$(PYTEST) -m "not slow" tests; quick=$$?; $(PYTEST) -m slow tests && exit $$quick

# Everyday work: the unit and integration tests not marked slow (docs/testing.md); the e2e
# folder (docs pages, real-data quality bars, bench tools, TPU plans) runs in `make test`.
test-quick: install
	$(PYTEST) -m "not slow" tests/unit tests/integration

lint: install
	$(BIN)/ruff check bert_jax configs tests

# Example creation (data), then model throughput beside HF Flax and HF PyTorch (model; the
# peers run in their own environment, .venv-peers; if it cannot be installed they are skipped
# with the reason), and a resumed run's time to its first step with and without the
# compilation cache (restart). About 20 min on 2 CPU cores; results also in bench_model.json.
bench: install
	$(BIN)/python -m bert_jax.tools.bench data
	-$(MAKE) peers-env
	$(BIN)/python -m bert_jax.tools.bench model
	$(BIN)/python -m bert_jax.tools.bench restart

PEERS := .venv-peers
peers-env: $(PEERS)/.installed

$(PEERS)/.installed: benchmarks/requirements-peers.txt
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet -r benchmarks/requirements-peers.txt
	touch $@

# Translation end to end on Multi30k (configs/multi30k.py; about 80 min on 2 CPU cores):
# vocab, training, averaging, beam search on test2016, sacreBLEU. Resumes in runs/multi30k_bench.
bench-mt: install
	$(BIN)/python -m bert_jax.tools.bench multi30k --workdir runs/multi30k_bench

# Every paper config compiled for the TPU slice its docstring names (libtpu, no TPU; slow:
# BERT-Large on v3-128 compiles for many minutes on 2 cores). Exits non-zero if one does not fit.
PLAN := $(BIN)/bert-jax plan
plan-paper: install
	$(PLAN) --config configs/bert_pretrain.py:base --topology v3-32
	$(PLAN) --config configs/bert_pretrain.py:large --topology v3-128
	$(PLAN) --config configs/wmt.py:base --topology v3-8
	$(PLAN) --config configs/wmt.py:big --topology v3-8
	$(PLAN) --config configs/glue.py:mnli --topology v3-8
	$(PLAN) --config configs/squad.py:v1 --topology v3-8
	$(PLAN) --config configs/ner.py:conll2003 --topology v3-8
	$(PLAN) --config configs/swag.py --topology v3-8

clean:
	rm -rf $(VENV) $(PEERS) *.egg-info .pytest_cache demo_out runs bench_model.json
