#!/usr/bin/env bash
# Creates the benchmark's own venv with the LiteLLM proxy (litellm[proxy] from PyPI), kept apart
# from .venv so the peer we measure against never shares dependencies with slotgate.
# Usage: bash bench/setup_litellm_env.sh   (idempotent; LITELLM_SPEC=litellm[proxy]==X.Y.Z to pin)
set -euo pipefail
cd "$(dirname "$0")"
PY="${PY:-python3.11}"
VENV="${LITELLM_VENV:-.venv-litellm}"
SPEC="${LITELLM_SPEC:-litellm[proxy]}"
if [ -x "$VENV/bin/litellm" ] && [ "${FORCE:-0}" != "1" ]; then
    echo "LiteLLM proxy already installed in bench/$VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))'))"
    exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$SPEC"
echo "LiteLLM proxy installed in bench/$VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))'))"
