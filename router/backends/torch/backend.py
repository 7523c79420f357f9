"""The ``torch`` fast backend: in-process slot reads with transformers (extra ``torch``).

``kind`` picks the reader: ``diffusion`` (DiffusionGemma one-step read, diffusion.py),
``causal`` (next-token read, causal.py) or ``masked`` (``[MASK]`` read, masked.py).
Each option is shown with a one-token label (labels.py); the read is the softmax of the slot's
logits over those label ids. Concurrent reads are coalesced into batches (coalescer.py) that run
in one worker thread, one batch at a time; the states of a batch are tokenized there in one
batched call (``encode_many``), not one by one on the event loop. On CUDA the diffusion read is compiled and replayed as
CUDA graphs captured at start-up (warm_up.py); ``ready()`` is False until then.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.types import DecisionRequest, Option, OptionScores, canonical_hash
from router.backends.base import FastBackend
from router.backends.labels import (
    LabelAlphabet,
    build_alphabet,
    check_alphabet,
    default_candidates,
    single_token_id,
)
from router.backends.torch.options import TorchOptions
from router.backends.torch.serve.build import MAX_LABELS, load_model, make_reader
from router.backends.torch.serve.coalescer import Coalescer, bucket_take
from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.backends.torch.serve.prompt import (
    DEFAULT_PREAMBLE,
    TEMPLATE_VERSION,
    Canvas,
    answer_canvas,
    chat_static,
    encode,
    encode_many,
    masked_prompt,
)
from router.backends.torch.serve.reader import SlotItem, SlotRead, SlotReader
from router.backends.torch.serve.warm_up import warm_up_fallbacks
from router.errors import BackendMalformed, BackendRejected, BackendUnavailable, ConfigError

if TYPE_CHECKING:  # settings need pydantic, which a bare GPU image lacks (bench/gpu_read.py runs there)
    from router.settings import FastBackendSettings

STATE_IDS_KEPT = 4096  # tokenized states kept (a few MB: ids of at most max_input_chars)
log = logging.getLogger(__name__)


class TorchBackend(FastBackend):
    """Reads with ``reader`` (a SlotReader: diffusion, causal or masked, made by ``make_reader``
    from the same ``options``) and ``tokenizer``, as ``options`` (a TorchOptions) say.

    ``model_id`` names the weights in the fingerprint (path plus a content hash when loaded from a
    folder). ``samples`` overrides the request's noise draws (diffusion only; the others are
    deterministic and read once). ``label_prefix`` is put before each label when it is checked
    (" " for BPE models that read " A" after "Answer:"). ``label_mode``: ``alphabet`` labels
    options A, B, ...; ``names`` reads the option names themselves (each must be one distinct
    token); ``auto`` reads the names when they qualify and the alphabet otherwise.

    Speed settings: concurrent ``read`` calls wait at most ``coalesce_window_ms`` for companions
    and run together up to ``max_batch`` items, one question a batch, as many of its waiting
    items as read best (``fixed_cost_items``, coalescer.bucket_take). The reader's own (``compiled``, ``graph_*``,
    ``prefix_cache``) were used when it was made; one that ``needs_warm_up`` is warmed in the
    worker thread before any read (``ready()`` is False until then) and replaced by what its
    ``warm_up`` returns (itself, or an eager twin when compiling or capturing failed).
    """

    name = "torch"

    def __init__(self, reader: SlotReader, tokenizer: Any, options: TorchOptions, *,
                 model_id: str) -> None:
        kind = options.kind
        self.reader, self.tokenizer, self.kind, self.model_id = reader, tokenizer, kind, model_id
        self.options = options
        label_prefix = options.label_prefix
        self.label_prefix = (" " if kind != "masked" else "") if label_prefix is None else label_prefix
        self.alphabet = self._alphabet(options.labels)
        self.label_mode = options.label_mode
        self.preamble = options.preamble if options.preamble is not None else DEFAULT_PREAMBLE
        self.answer_prefix = options.answer_prefix
        self.samples = options.samples if kind == "diffusion" else 1
        self.max_batch, self.max_tokens = options.max_batch, options.max_tokens
        self.canvas: dict[str, Any] = {
            "length": options.canvas_length, "step": options.canvas_step,
            "thought_block": options.thought_block, "turn_close_id": options.turn_close_id,
            "pad_id": options.pad_id,
        }
        self._questions: dict[tuple[str, str], _Question] = {}
        # States tokenized lately (worker thread only): one message asked several questions (a
        # ticket's intent, queue and priority) is tokenized once (a long state's tokenizing is a
        # visible share of a single read: bench.gpu_read's single_phases_ms)
        self._state_ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # One worker thread owns the model: warm-up first, then every batch, one at a time.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-read")
        # A read runs one question's items at a time (their shared prefix), so a batch takes one
        # question and as many of its waiting items as read best (coalescer.bucket_take)
        grouped = kind != "masked" and options.prefix_cache
        self._coalescer: Coalescer[_Pending, SlotRead] = Coalescer(
            self._read_batch, executor=self._executor, window_s=options.coalesce_window_ms / 1000,
            max_batch=options.max_batch, group_of=_question_of if grouped else None,
            plan=self._plan if grouped else None)
        self.compiled = False  # True once a compiled (graph-replayed) read is warm
        self._warm_fallbacks: tuple[str, ...] = ()  # what warm-up fell back to (serving())
        self._warm: Future[None] | None = None
        if reader.needs_warm_up:
            self._warm = self._executor.submit(self._warm_up)

    def _warm_up(self) -> None:
        """In the worker thread: the reader warmed on a sample request of the real template."""
        sample = DecisionRequest("warm-up", "Which?", (Option("yes"), Option("no")), "warm-up")
        started = self.reader
        self.reader = self.reader.warm_up(self.item(sample))
        self.compiled = self.reader.compiled
        self._warm_fallbacks = warm_up_fallbacks(started, self.reader)

    def serving(self) -> Mapping[str, Any]:
        """What serves reads now, for operators (``/readyz``): the reader's kind and device,
        whether the compiled read is warm, and for a diffusion reader its kernel choice, its CUDA
        graphs and ``fallbacks``: each thing it serves without that it was set up to use (a
        Triton family whose start-up check failed on CUDA, the memory-efficient attention or the
        eager read after a failed warm-up, a compiled read asked for but not served). On the CPU
        the plain eager read is the intended one, not a fallback. ``prefix_cache``: the static
        prefixes' cache (entries, capacity, hits, misses, evictions): evictions mean more
        questions in rotation than ``prefix_cache_entries``. Not
        part of the identity."""
        reader = self.reader
        out: dict[str, Any] = {"kind": self.kind, "device": str(reader.device),
                               "compiled": self.compiled, "ready": self._warm_done()}
        prefixes = getattr(reader, "prefixes", None)  # the masked reader caches none
        if isinstance(prefixes, PrefixLRU) and self.options.prefix_cache:
            out["prefix_cache"] = prefixes.stats()
        if self.kind != "diffusion":
            return {**out, "fallbacks": []}
        choice = getattr(reader, "choice", None)  # None: the two-pass read (untied weights)
        graphs = getattr(reader, "graphs", None)
        fallbacks = self._device_fallbacks(reader, choice) if choice is not None else []
        fallbacks += self._warm_fallbacks
        asked = self.options.compiled if self.options.compiled is not None else (
            reader.device.type == "cuda")
        if asked and self._warm_done() and not reader.compiled and not self._warm_fallbacks:
            fallbacks.append("compiled read asked for, but the reader is not compiled: serving "
                             "the eager read" + ("" if choice is not None else
                                                 " (the two-pass read: encoder and decoder "
                                                 "weights are not tied)"))
        return {**out, "kernels": choice.summary() if choice is not None else {"two_pass": True},
                "cuda_graphs": len(graphs.graphs) if graphs is not None else 0,
                "fallbacks": fallbacks}

    def _warm_done(self) -> bool:
        return self._warm is None or self._warm.done()

    def _device_fallbacks(self, reader: Any, choice: Any) -> list[str]:
        """The ops whose fast forms ``choice`` leaves off because their device checks failed on
        this CUDA device (ops.py ``device_fallbacks``; the checks are memoised: asked again, they
        answer what ``default_choice`` was told). None on the CPU, where the reference forms are
        the intended ones. The prefix key chunks are asked only where the options want them."""
        if reader.device.type != "cuda":
            return []
        from dataclasses import replace

        from router.backends.torch.kernels.split_kv import SPLIT_KV_CHUNKS
        from router.backends.torch.model.ops import OP_BY_SWITCH, device_fallbacks

        dtype = next(reader.model.parameters()).dtype
        out = device_fallbacks(choice, reader.device, dtype, ("triton", "fused_moe", "causal_own"))
        if self.options.split_kv_items != 0 and choice.prefix_splits == 1:  # asked for, not served
            chunks = self.options.split_kv_chunks or SPLIT_KV_CHUNKS
            op = OP_BY_SWITCH["prefix_splits"]
            problem = op.check(replace(choice, prefix_splits=chunks), reader.device, dtype)
            out += [op.report(problem)] if problem else []
        return out

    def _alphabet(self, labels: Sequence[str] | None) -> LabelAlphabet:
        if labels is not None:
            return check_alphabet(self.tokenizer, [self.label_prefix + label for label in labels])
        candidates = [self.label_prefix + c for c in default_candidates()]
        return build_alphabet(self.tokenizer, limit=MAX_LABELS, candidates=candidates)

    @classmethod
    def from_settings(cls, settings: FastBackendSettings) -> TorchBackend:
        typed = settings.options_as(TorchOptions)  # validated when settings loaded
        if settings.model_path is None:
            raise ConfigError("torch backend needs fast.model_path", field="fast.model_path")
        return cls.from_options(typed, settings.model_path)

    @classmethod
    def from_folder(cls, kind: str, path: Path | str, **options: Any) -> TorchBackend:
        """A backend over a LOCAL model folder; ``options`` are TorchOptions fields."""
        return cls.from_options(TorchOptions(kind=kind, **options), path)

    @classmethod
    def from_options(cls, options: TorchOptions, path: Path | str) -> TorchBackend:
        """A backend over a LOCAL model folder, as ``options`` say."""
        model, tokenizer, model_id = load_model(options.kind, path, device=options.device,
                                                dtype=options.dtype, gguf_file=options.gguf_file)
        return cls(make_reader(options, model, tokenizer), tokenizer, options, model_id=model_id)

    def identity(self) -> Mapping[str, Any]:
        ident: dict[str, Any] = {
            "backend": self.name, "kind": self.kind, "model": self.model_id,
            "template": TEMPLATE_VERSION,
            "prompt": canonical_hash([self.preamble, self.answer_prefix])[:16],
            "labels": list(self.alphabet.labels), "label_mode": self.label_mode,
            "samples": self.samples,
        }
        if self.kind == "diffusion":
            ident["canvas"] = self.canvas
        return ident

    async def ready(self) -> bool:
        """False while the compiled read warms up (compiling, capturing graphs)."""
        return self._warm_done()

    async def aclose(self) -> None:
        await self._coalescer.aclose()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        pending = [self.pending(request) for request in requests]  # BackendRejected here
        try:  # coalesced with other callers' requests into one batch
            reads = await self._coalescer.submit(pending)
        except (RuntimeError, MemoryError) as exc:  # device errors, out of memory
            raise BackendUnavailable(f"torch {self.kind} read failed: {exc}") from exc
        except (ValueError, IndexError) as exc:  # a prompt the reader cannot read
            raise BackendMalformed(f"torch {self.kind} read failed: {exc}") from exc
        return [self._scores(request, read) for request, read in zip(requests, reads, strict=True)]

    def _plan(self, available: int) -> int:
        """How many of ``available`` waiting items of one question the next batch reads: the
        reader's graph buckets (``batch_sizes``: padding costs like items) and a read's fixed
        cost (``fixed_cost_items``) decide (``coalescer.bucket_take``)."""
        return bucket_take(available, self.reader.batch_sizes, self.options.fixed_cost_items)

    def _read_batch(self, pending: list[_Pending]) -> list[SlotRead]:
        """One coalesced batch, in the worker thread: its states tokenized together, then read.
        Why: with closed-loop callers the GPU idles while their next states are tokenized; one
        batched call (parallel in a fast tokenizer, the GIL released) takes a fraction of the
        one-by-one encodes on the event loop."""
        return self.reader.read(self.items(pending))

    def _scores(self, request: DecisionRequest, read: SlotRead) -> OptionScores:
        proba = read.proba.astype("float64").tolist()  # the same floats, half the time
        total = sum(proba)
        raw = {"draws": int(read.draws.shape[0]), "entropy_nats": read.entropy_nats,
               "label_mass": read.label_mass}
        return OptionScores(request.option_names, tuple(p / total for p in proba), raw)

    def item(self, request: DecisionRequest) -> SlotItem:
        """The token-level read of one request; BackendRejected when it cannot be read."""
        return self.items([self.pending(request)])[0]

    def pending(self, request: DecisionRequest) -> _Pending:
        """A request checked and its question prepared (BackendRejected when it cannot be read);
        the state is tokenized later, with its batch (``items``)."""
        question = self.question(request)
        if self.kind == "masked":  # the state is cut to fit, so the whole prompt is per request
            prompt = masked_prompt(self.tokenizer, request, question.labels, preamble=self.preamble,
                                   answer_prefix=self.answer_prefix, max_tokens=self.max_tokens)
            return _Pending(request, question, SlotItem(prompt.prefix_ids, prompt.suffix_ids, (), 0,
                                                        question.label_ids, 1, request.seed))
        return _Pending(request, question, None)

    def items(self, pending: Sequence[_Pending]) -> list[SlotItem]:
        """The token-level reads of ``pending``, their states tokenized in one batched call: each
        distinct state once, and none that the last ``STATE_IDS_KEPT`` tokenized."""
        texts = dict.fromkeys(p.request.state for p in pending if p.item is None)
        known = self._state_ids
        for text in texts:
            if text in known:
                known.move_to_end(text)
        missing = [text for text in texts if text not in known]
        if missing:
            for text, ids in zip(missing, encode_many(self.tokenizer, missing), strict=True):
                known[text] = ids
        states = {text: known[text] for text in texts}
        while len(known) > STATE_IDS_KEPT:
            known.popitem(last=False)
        return [p.item if p.item is not None else self._item(p, states[p.request.state])
                for p in pending]

    def _item(self, pending: _Pending, state_ids: tuple[int, ...]) -> SlotItem:
        request, question = pending.request, pending.question
        suffix = state_ids + question.tail_ids
        if question.canvas is None:
            return SlotItem(question.prefix_ids, suffix, (), 0, question.label_ids, 1, request.seed)
        return SlotItem(question.prefix_ids, suffix, question.canvas.ids, question.canvas.slot,
                        question.label_ids, self.samples or request.samples, request.seed)

    def question(self, request: DecisionRequest) -> _Question:
        """What every state of one question shares, tokenized once: labels, the static prefix
        (the prefix cache's key), the answer tail and the canvas. Why: tokenizing 77 option
        names per request cost more host time than a batched GPU read leaves per request."""
        key = (request.signature(), request.question_id)
        cached = self._questions.get(key)
        if cached is not None:
            return cached
        n = len(request.options)
        if n < 2:
            raise BackendRejected(f"torch backend reads 2 or more options, got {n}", field="options")
        labels, label_ids = self.labels_for(request)
        prefix_ids: tuple[int, ...] = ()
        tail_ids: tuple[int, ...] = ()
        canvas: Canvas | None = None
        try:
            if self.kind != "masked":
                kwargs = {"enable_thinking": False} if self.kind == "diffusion" else {}
                prefix_ids, after = chat_static(self.tokenizer, request, labels, preamble=self.preamble,
                                                **kwargs)
                tail_ids = encode(self.tokenizer, after + self.answer_prefix)
            if self.kind == "diffusion":
                canvas = answer_canvas(
                    self.tokenizer, request.question_id, thought_block=self.canvas["thought_block"],
                    turn_close_id=self.canvas["turn_close_id"], pad_id=self.canvas["pad_id"],
                    canvas_length=self.canvas["length"], canvas_step=self.canvas["step"],
                    first_label_id=label_ids[0])
        except ValueError as exc:
            raise BackendRejected(str(exc), field="options") from exc
        question = _Question(labels, label_ids, prefix_ids, tail_ids, canvas, key)
        if len(self._questions) >= 256:
            self._questions.clear()
        self._questions[key] = question
        return question

    def labels_for(self, request: DecisionRequest) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The option labels and their token ids (see ``label_mode``)."""
        if self.label_mode != "alphabet":
            names = [self.label_prefix + name for name in request.option_names]
            ids = [single_token_id(self.tokenizer, name) for name in names]
            if None not in ids and len(set(ids)) == len(ids):
                return tuple(names), tuple(i for i in ids if i is not None)
            if self.label_mode == "names":
                raise BackendRejected("option names are not distinct single tokens for this "
                                      "tokenizer (label_mode names)", field="options")
        n = len(request.options)
        if n > len(self.alphabet):
            raise BackendRejected(
                f"torch backend reads up to {len(self.alphabet)} options, got {n}", field="options")
        return self.alphabet.labels[:n], self.alphabet.ids[:n]


@dataclass(frozen=True, slots=True)
class _Question:
    labels: tuple[str, ...]
    label_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...]  # static prompt (empty for masked reads)
    tail_ids: tuple[int, ...]  # after the state: the template's close and the answer prefix
    canvas: Canvas | None  # diffusion reads only
    key: tuple[str, str]  # (options' signature, question id): what the coalescer groups by


@dataclass(frozen=True, slots=True, eq=False)
class _Pending:
    """A checked request waiting for its batch; ``item`` is already built for masked reads."""

    request: DecisionRequest
    question: _Question
    item: SlotItem | None


def _question_of(pending: _Pending) -> tuple[str, str]:
    return pending.question.key
