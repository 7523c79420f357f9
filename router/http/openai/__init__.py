"""The OpenAI-compatible surface: request models and reply rendering (wire) and its routes."""
