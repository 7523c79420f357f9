"""Start-up of a compiled diffusion reader: compile its pieces (at their first call) and capture
its CUDA graphs, in the backend's worker thread before any read. Nothing of the reader is changed:
when any of it fails, an eager twin over the same model is returned (logged) and serves instead;
``failures(twin)`` says why (the backend reports it: ``TorchBackend.serving``)."""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar, cast

from router.backends.torch.kernels.attention import attend_efficient, pick_attention

if TYPE_CHECKING:
    import torch

    from router.backends.torch.model.choice import KernelChoice
    from router.backends.torch.serve.graphs import GraphSet
    from router.backends.torch.serve.reader import SlotItem, SlotRead, SlotReader


class Warmable(Protocol):
    """What the warm-up uses of a diffusion reader (``DiffusionSlotReader``, which calls it: typed
    here so this module does not import the reader's)."""

    @property
    def choice(self) -> KernelChoice: ...

    @property
    def model(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def compiled(self) -> bool: ...

    @property
    def graphs(self) -> GraphSet | None: ...

    def read(self, items: list[SlotItem]) -> list[SlotRead]: ...

    def rebuilt(self, choice: KernelChoice, *, graphs: bool = True) -> Self: ...


Reader = TypeVar("Reader", bound=Warmable)
log = logging.getLogger(__name__)
# the failures behind each twin warm_up returned instead of its reader (weak: a twin's entry goes
# with it)
_FAILURES: weakref.WeakKeyDictionary[Warmable, tuple[str, ...]] = weakref.WeakKeyDictionary()


def failures(reader: object) -> tuple[str, ...]:
    """Why ``warm_up`` returned ``reader`` instead of the reader it was given: its failures in
    order (``Type: message``; the cuDNN capture's first, where it was retried). Empty for any
    other reader."""
    try:
        return _FAILURES.get(cast("Warmable", reader), ())
    except TypeError:  # not weak-referenceable: never one of warm_up's twins
        return ()


def warm_up(reader: Reader, sample: SlotItem) -> Reader:
    """``reader`` compiled and its graphs captured on ``sample``'s prefix and canvas; or, when
    that fails, a reader without cuDNN attention (which may refuse capture), else an eager one."""
    started = time.monotonic()
    try:
        _warm(reader, sample)
        return reader
    # Compiling (dynamo, inductor, triton) and capturing raise many unrelated exception types;
    # any of them means the same thing here: serve another reader, and say so.
    except Exception as exc:  # noqa: BLE001
        failure: BaseException = exc
    seen = [_text(failure)]
    choice = reader.choice
    if "cudnn" in dict(choice.attention).values():  # cuDNN attention may refuse capture
        log.warning("torch read: capture failed with cuDNN attention (%s: %s); retrying with the "
                    "memory-efficient kernel", type(failure).__name__, failure)
        dtype = next(reader.model.parameters()).dtype
        attention = pick_attention(reader.device, dtype, set(dict(choice.attention)),
                                   kernels=(("efficient", attend_efficient),))
        try:
            again = reader.rebuilt(replace(choice, attention=attention))
            _warm(again, sample)
            _FAILURES[again] = tuple(seen)
            return again
        except Exception as exc:  # noqa: BLE001 (as above)
            failure = exc
            seen.append(_text(exc))
    log.warning("torch read: compiled read failed after %.1f s, serving the eager read: %s: %s",
                time.monotonic() - started, type(failure).__name__, failure)
    eager = reader.rebuilt(choice.eager(), graphs=False)
    _FAILURES[eager] = tuple(seen)
    return eager


def _text(failure: BaseException) -> str:
    return f"{type(failure).__name__}: {failure}"


def _warm(reader: Warmable, sample: SlotItem) -> None:
    started = time.monotonic()
    if reader.graphs is not None:
        reader.graphs.warm_up(sample.prefix_ids, sample.canvas_ids, sample.slot)
    else:  # compiled without graphs: the first read compiles
        reader.read([sample])
    count = len(reader.graphs.graphs) if reader.graphs is not None else 0
    log.info("torch read: compiled=%s, %d CUDA graphs captured in %.1f s", reader.compiled, count,
             time.monotonic() - started)


def warm_up_fallbacks(started: SlotReader, warmed: SlotReader) -> tuple[str, ...]:
    """What ``warmed`` (what ``started.warm_up`` returned) serves without that ``started`` had:
    the memory-efficient attention for cuDNN's, the eager read for the compiled one; each with
    the failure behind it where warm-up kept it (``warm_up.failures``)."""
    before, after = getattr(started, "choice", None), getattr(warmed, "choice", None)
    if warmed is started or before is None or after is None:
        return ()
    why = list(failures(warmed))
    out = []
    if before.attention != after.attention:
        cause = why.pop(0) if why else ""
        out.append("capture failed with cuDNN attention: serving the memory-efficient kernel"
                   + (f" ({cause})" if cause else ""))
    graphs_lost = (getattr(started, "graphs", None) is not None
                   and getattr(warmed, "graphs", None) is None)
    if (started.compiled and not warmed.compiled) or graphs_lost:
        cause = why[-1] if why else ""
        out.append("compiled read failed at warm-up: serving the eager read"
                   + (f" ({cause})" if cause else ""))
    return tuple(out)
