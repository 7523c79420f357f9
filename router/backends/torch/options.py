"""The torch backend's options (``fast.options`` when ``fast.kind`` is ``torch``), checked when
settings load. No torch import here: settings load this on every deployment."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from router.backends.options_base import BackendOptions


class TorchOptions(BackendOptions):
    """What ``TorchBackend.from_settings`` reads. Unset options keep the backend's own defaults
    (``model_dump(exclude_unset=True)`` is what reaches the constructor)."""

    kind: Literal["diffusion", "causal", "masked"]
    device: str = "cpu"
    dtype: str = "float32"
    gguf_file: str | None = None
    prefix_cache: bool = True
    # Static prefixes (one a question) whose encoded KV caches are kept (prefix_lru.py). Traffic
    # that rotates through more questions misses on every read: each miss encodes the whole
    # prefix again. On the full DiffusionGemma a 1,400-token prefix holds about 0.24 GB (25
    # sliding layers keep 1,023 tokens x 8 KV heads x 256, 5 full layers 1,400 x 2 x 512; keys
    # and values in bf16). /readyz shows the cache's hits, misses and evictions.
    prefix_cache_entries: int = Field(8, ge=1)
    labels: list[str] | None = None
    label_prefix: str | None = None
    label_mode: Literal["alphabet", "names", "auto"] = "auto"
    preamble: str | None = None
    answer_prefix: str = "Answer:"
    samples: int | None = Field(None, ge=1)
    max_batch: int = Field(32, ge=1)  # items coalesced into one batch
    max_tokens: int = Field(512, ge=1)
    canvas_length: int = Field(64, ge=2)
    canvas_step: int = Field(16, ge=1)
    thought_block: str = "<|channel>thought\n<channel|>"
    turn_close_id: int = Field(106, ge=0)
    pad_id: int = Field(0, ge=0)
    # Speed (coalescer.py, warm_up.py, graphs.py); see TorchBackend's docstring.
    coalesce_window_ms: float = Field(2.0, ge=0)
    # A read's fixed cost in items' worth: a read of a graph bucket of b items costs about
    # fixed_cost_items + b (an H200: (4 + b) x 3.9 ms, docs/backends.md). The coalescer leaves
    # waiting items of a question for the next batch when the bucket that holds them all pads
    # more than it saves (coalescer.bucket_take); larger values pad more, read fewer batches.
    fixed_cost_items: float = Field(4.0, ge=0)
    # A batch takes the waiting items of one question (the oldest request's): the reader reads
    # one question's items at a time, so a batch of several is several reads back to back that
    # every caller waits for. False: a batch takes every question (before the sixth session).
    coalesce_by_question: bool = True
    # Opt-in (diffusion reads): a batch takes every question whose canvas has the batch's width,
    # and the reader reads them in ONE eager pass, each item reading only its own question's
    # prefix (read_inputs.PrefixGroups), instead of one read a question. Exact (tested on the
    # CPU against reads alone); its speed on a GPU is NOT measured yet (docs/backends.md): a
    # batch of several questions runs eagerly, where one question's batch replays a CUDA graph.
    mixed_question_reads: bool = False
    # With mixed_question_reads and graphs: the static prefix buffers, so the questions a batch
    # of several questions may hold in a graph bucket (each bucket: that many groups of g items,
    # for the graph_batches g whose groups fit in the largest; about 0.25 GB a buffer on the full
    # DiffusionGemma). A batch no such bucket holds is read eagerly.
    graph_mixed_groups: int = Field(4, ge=2)
    compiled: bool | None = None  # None: on for a diffusion reader on CUDA
    graph_batches: list[int] | None = None
    graph_draws: list[int] | None = None
    graph_widths: list[int] | None = None
    graph_prefix_tokens: int = Field(2048, ge=1)
    # Opt-in FP8 copies of the experts' weights for a diffusion reader on a Hopper GPU (fp8.py):
    # a faster single read, a slower batch of 32 (docs/backends.md: measured, and by how much the
    # read changes); adds ~23 GB of GPU memory beside the bf16 weights. Refused, naming it, where
    # it cannot run.
    fp8: Literal["off", "experts"] = "off"
    # Opt-in: graph buckets of at most this many items (1: single reads) read the sliding layers'
    # attention by FlexAttention compiled for each bucket's shapes: a single read 1.2 ms faster
    # on an H200, about 5 s more warm-up per bucket (docs/backends.md). 0: off.
    static_flex_items: int = Field(0, ge=0)
    # Reads of at most this many items (1: single reads) read the shared prefix's attention in
    # key chunks run as one call's batch (split_kv.py): exact up to rounding, no warm-up cost
    # (docs/backends.md). None: the device's default (split_kv.SPLIT_KV_ITEMS on CUDA); 0: off.
    split_kv_items: int | None = Field(None, ge=0)
    # How many key chunks (None: the device's default, split_kv.SPLIT_KV_CHUNKS).
    split_kv_chunks: int | None = Field(None, ge=2)

    @model_validator(mode="after")
    def _mixed_reads_need_one_pass(self) -> TorchOptions:
        if self.mixed_question_reads and self.kind != "diffusion":
            raise ValueError(f"mixed_question_reads: only a diffusion reader reads several "
                             f"questions in one pass (kind is {self.kind!r})")
        return self
