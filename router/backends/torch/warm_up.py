"""Start-up of the compiled diffusion read: compile the one-pass pieces, capture the CUDA graphs,
and fall back to the eager read (logged) when any of it fails. Runs in the backend's worker
thread before any read; the backend reports ready when it returns."""

from __future__ import annotations

import logging
import time
from typing import Any

from policies.types import DecisionRequest, Option
from router.backends.torch.compiled import compile_pieces, reset_pieces
from router.backends.torch.graphs import GraphSet

log = logging.getLogger(__name__)


def warm_up(backend: Any, *, capture: bool = True, compile_backend: str = "inductor") -> None:
    """Compile and capture for ``backend`` (a TorchBackend over a DiffusionSlotReader); sets
    ``backend.compiled``. A sample request gives the canvas and a prefix of the real template."""
    reader = backend.reader
    shapes = backend.graph_shapes
    sample = DecisionRequest("warm-up", "Which?", (Option("yes"), Option("no")), "warm-up")
    item = backend.item(sample)
    started = time.monotonic()
    try:
        compile_pieces(reader.onepass, backend=compile_backend)
        graphs = GraphSet(reader, batches=shapes["batches"], draws=shapes["draws"],
                          widths=shapes["widths"], prefix_tokens=shapes["prefix_tokens"],
                          labels=len(backend.alphabet), capture=capture)
        graphs.warm_up(item.prefix_ids, item.canvas_ids, item.slot)
    # Compiling (dynamo, inductor, triton) and capturing raise many unrelated exception types;
    # any of them means the same thing here: serve the eager read, and say so.
    except Exception as exc:  # noqa: BLE001
        reset_pieces(reader.onepass)
        reader.graphs = None
        backend.compiled = False
        log.warning("torch read: compiled read failed after %.1f s, serving the eager read: %s: %s",
                    time.monotonic() - started, type(exc).__name__, exc)
        return
    reader.graphs = graphs
    backend.compiled = True
    log.info("torch read: compiled, %d CUDA graphs captured in %.1f s", len(graphs.graphs),
             time.monotonic() - started)
