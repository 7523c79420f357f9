"""Fast backends: one protocol (``base.FastBackend``), one file per implementation."""
