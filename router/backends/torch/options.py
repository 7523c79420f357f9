"""The torch backend's options (``fast.options`` when ``fast.kind`` is ``torch``), checked when
settings load. No torch import here: settings load this on every deployment.

The options fall in four groups: what names the model and where it runs, the
prompt and labels, the graph shapes, and at most eight speed options (``SPEED_OPTIONS``), each documented with its
default and what it trades (``docs/backends.md`` renders the table from the field descriptions:
``python -m bench.make_docs``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from router.backends.options_base import BackendOptions

SPEED_OPTIONS = ("prefix_cache", "prefix_cache_entries", "max_batch", "coalesce_window_ms",
                 "fixed_cost_items", "compiled", "split_kv_items", "split_kv_chunks")
GRAPH_OPTIONS = ("graph_batches", "graph_draws", "graph_widths", "graph_prefix_tokens")


class TorchOptions(BackendOptions):
    """What ``TorchBackend.from_settings`` reads. Unset options keep the backend's own defaults
    (``model_dump(exclude_unset=True)`` is what reaches the constructor)."""

    kind: Literal["diffusion", "causal", "masked"]
    device: str = "cpu"
    dtype: str = "float32"
    gguf_file: str | None = None
    labels: list[str] | None = None
    label_prefix: str | None = None
    label_mode: Literal["alphabet", "names", "auto"] = "auto"
    preamble: str | None = None
    answer_prefix: str = "Answer:"
    samples: int | None = Field(None, ge=1)
    max_tokens: int = Field(512, ge=1)
    canvas_length: int = Field(64, ge=2)
    canvas_step: int = Field(16, ge=1)
    thought_block: str = "<|channel>thought\n<channel|>"
    turn_close_id: int = Field(106, ge=0)
    pad_id: int = Field(0, ge=0)

    # -- speed ------------------------------------------------------------------------------
    prefix_cache: bool = Field(True, description=(
        "Keep each question's static prefix encoded (its KV cache) and reuse it across requests. "
        "Off: every read encodes its whole prompt (slower, no cache memory)."))
    prefix_cache_entries: int = Field(8, ge=1, description=(
        "Static prefixes (one a question) whose KV caches are kept, least recently used out. "
        "Traffic over more questions misses on every read; each entry of a 1,400-token prefix "
        "holds about 0.24 GB on the full DiffusionGemma (bf16)."))
    max_batch: int = Field(32, ge=1, description=(
        "Items the coalescer gathers into one read. Larger: more reads/s under load, a longer "
        "wait for each caller of a batch."))
    coalesce_window_ms: float = Field(2.0, ge=0, description=(
        "Longest wait for companions before a batch starts, only under concurrency (a lone "
        "caller's read starts at once). Larger: fuller batches, more latency."))
    fixed_cost_items: float = Field(4.0, ge=0, description=(
        "A read's fixed cost in items' worth (a graph bucket of b items costs about "
        "fixed_cost_items + b). The coalescer leaves waiting items for the next batch when the "
        "bucket that holds them all pads more than it saves; larger values pad more and read "
        "fewer batches."))
    compiled: bool | None = Field(None, description=(
        "The diffusion read compiled (torch.compile) and replayed as CUDA graphs of the graph "
        "shapes, warmed up at start-up (/readyz false meanwhile). None: on for a diffusion reader "
        "on CUDA, off elsewhere. Off: no warm-up, a slower read."))
    split_kv_items: int | None = Field(None, ge=0, description=(
        "Reads of at most this many items read the shared prefix's attention in key chunks run "
        "as one call's batch (exact up to rounding, no warm-up cost). None: the device's default "
        "(1 on CUDA, 0 elsewhere); 0: off."))
    split_kv_chunks: int | None = Field(None, ge=2, description=(
        "How many key chunks split_kv_items reads split the prefix into. None: the device's "
        "default (4)."))

    # -- graph shapes (the buckets warm-up captures; a read is padded up to one) -------------
    graph_batches: list[int] | None = None
    graph_draws: list[int] | None = None
    graph_widths: list[int] | None = None
    graph_prefix_tokens: int = Field(2048, ge=1)
