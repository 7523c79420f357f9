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
from router.backends.torch.prefix_attention import attend_efficient, pick_attend

log = logging.getLogger(__name__)


def warm_up(backend: Any, *, capture: bool = True, compile_backend: str = "inductor") -> None:
    """Compile and capture for ``backend`` (a TorchBackend over a DiffusionSlotReader); sets
    ``backend.compiled``. A sample request gives the canvas and a prefix of the real template."""
    reader = backend.reader
    sample = DecisionRequest("warm-up", "Which?", (Option("yes"), Option("no")), "warm-up")
    item = backend.item(sample)
    started = time.monotonic()
    try:
        graphs = _compile_and_capture(backend, item, capture, compile_backend)
    # Compiling (dynamo, inductor, triton) and capturing raise many unrelated exception types;
    # any of them means the same thing here: serve the eager read, and say so.
    except Exception as exc:  # noqa: BLE001
        kernels = getattr(reader.onepass.attend, "kernels", {})
        if "cudnn" in kernels.values():  # cuDNN attention may refuse capture: try without it
            log.warning("torch read: capture failed with cuDNN attention (%s: %s); retrying with "
                        "the memory-efficient kernel", type(exc).__name__, exc)
            try:
                reader.onepass.attend = pick_attend(
                    reader.device, next(reader.model.parameters()).dtype, set(kernels),
                    kernels=(("efficient", attend_efficient),))
                graphs = _compile_and_capture(backend, item, capture, compile_backend)
            except Exception as again:  # noqa: BLE001 (as above)
                _fall_back(backend, again, started)
                return
        else:
            _fall_back(backend, exc, started)
            return
    reader.graphs = graphs
    backend.compiled = True
    log.info("torch read: compiled, %d CUDA graphs captured in %.1f s", len(graphs.graphs),
             time.monotonic() - started)


def _compile_and_capture(backend: Any, item: Any, capture: bool, compile_backend: str) -> GraphSet:
    reader, shapes = backend.reader, backend.graph_shapes
    compile_pieces(reader.onepass, backend=compile_backend)
    graphs = GraphSet(reader, batches=shapes["batches"], draws=shapes["draws"],
                      widths=shapes["widths"], prefix_tokens=shapes["prefix_tokens"],
                      labels=len(backend.alphabet), capture=capture)
    graphs.warm_up(item.prefix_ids, item.canvas_ids, item.slot)
    return graphs


def _fall_back(backend: Any, exc: BaseException, started: float) -> None:
    reset_pieces(backend.reader.onepass)
    backend.reader.graphs = None
    backend.compiled = False
    log.warning("torch read: compiled read failed after %.1f s, serving the eager read: %s: %s",
                time.monotonic() - started, type(exc).__name__, exc)
