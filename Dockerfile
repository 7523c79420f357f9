# slotgate: the routing server. CPU only: the fast read runs in the vLLM container (compose.yaml),
# or in-process for the sklearn/embedding backends. No torch is installed here.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # litellm would otherwise fetch its model cost map from the internet at start-up
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    HF_HUB_OFFLINE=1

WORKDIR /app

# Dependencies first, code second, so editing code does not reinstall the dependencies.
COPY pyproject.toml README.md ./
COPY router ./router
COPY policies ./policies
COPY calibration ./calibration
# transformers only for the vllm backend's tokenizer (a local folder); it runs without torch.
RUN pip install . "transformers>=5.0"

RUN useradd --create-home --uid 10001 slotgate && mkdir -p /app/var && chown slotgate /app/var
USER slotgate

EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"
# Configured by SLOTGATE_* environment variables (compose.yaml); to use a YAML config, mount it
# and add "--config", "/app/slotgate.yaml".
CMD ["slotgate", "serve", "--host", "0.0.0.0", "--port", "8080"]
