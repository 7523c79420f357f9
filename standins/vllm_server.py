"""Stand-in for vLLM's OpenAI chat API serving DiffusionGemma with diffusion reads: validates the
diffusion request fields with vLLM's rules and messages (``vllm/utils/diffusion.py``; 400) and
answers with logprobs at the answer slot, in vLLM's chat logprobs shape ("token_id:N" tokens).

What it holds to, because a real engine does and a client would otherwise fail silently:
- a one-step read is ``diffusion_read_only`` AND ``diffusion_max_steps == 1`` (vLLM's
  ``is_one_step_read``); any other read runs the denoise schedule and reports the converged
  canvas: sharper probabilities, and no error;
- the model predicts a label at the slot as the token it is in the answer line ``"{id}: {label}"``
  (with a BPE tokenizer the id of " A", not of "A"); other label ids get almost no mass;
- canvas ids are checked against the ENGINE's vocabulary (``vocab_size``, 262144 for
  DiffusionGemma), not the tokenizer's length;
- ``engine_samples=False`` plays an older vLLM that does not know ``diffusion_samples``: it
  ignores the field and returns one draw.

Stand-in conventions (a real model needs none): the slot is the last position before the turn
close, i.e. ``max_tokens - 2``; the question id and options are parsed from the system turn
(``Question {id}:`` and ``  LABEL: name (desc)`` / ``  LABEL`` lines); the answer comes from the
BANKING77 reader. Other positions echo their seed token.

    python -m standins.vllm_server --port 8000 --tokenizer PATH [--data ../shared/data/banking77]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import uuid
from pathlib import Path
from typing import Any

from standins.harness import Reply, StandinServer
from standins.reader import Banking77Reader

OPTION_LINE = re.compile(r"^  (\S+?)(?:: (.+?)(?: \((.*)\))?)?$")
QUESTION_LINE = re.compile(r"^Question (.+?): ")
ENGINE_VOCAB = 262_144  # DiffusionGemma's vocabulary
CONVERGED_SHARPNESS = 4.0  # a full denoise schedule reports a near-settled canvas: p**4, renormalised
OFF_SLOT_LOGPROB = math.log(1e-6)  # what a label's id gets where the model writes another token
LOGPROB_TOKEN_ID_CAP = 128
LABEL_MASS = 0.9  # unconstrained reads leave some mass on non-label tokens, as a real model does


def model_list(model: str, root: str, max_model_len: int) -> dict[str, Any]:
    """vLLM's answer to GET /v1/models (``ModelList`` of one ``ModelCard``)."""
    return {"object": "list", "data": [{
        "id": model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
        "root": root, "parent": None, "max_model_len": max_model_len,
        "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                        "created": int(time.time()), "allow_create_engine": False,
                        "allow_sampling": True, "allow_logprobs": True,
                        "allow_search_indices": False, "allow_view": True,
                        "allow_fine_tuning": False, "organization": "*", "group": None,
                        "is_blocking": False}]}]}


class BadRequest(Exception):
    pass


class VllmStandin(StandinServer):
    def __init__(self, *, reader: Banking77Reader, tokenizer: Any, model: str = "dgemma",
                 canvas_length: int = 64, max_logprobs: int = 32, max_samples: int = 8,
                 vocab_size: int = ENGINE_VOCAB, engine_samples: bool = True,
                 root: str | None = None, max_model_len: int = 8192,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reader = reader
        self.tokenizer = tokenizer
        self.model = model
        # What GET /v1/models says of the model, as vLLM's ModelCard does: ``root`` is the
        # weights it loaded (a repo id or a path), served under the name ``model``.
        self.root = root if root is not None else f"standin/{model}"
        self.max_model_len = max_model_len
        self.canvas_length = canvas_length
        self.max_logprobs = max_logprobs
        self.max_samples = max_samples
        self.vocab_size = vocab_size
        self.engine_samples = engine_samples

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        if method == "GET":
            if path == "/health":
                return Reply(200, "")
            if path == "/v1/models":
                return Reply(200, model_list(self.model, self.root, self.max_model_len))
            return Reply(404, {"detail": "Not Found"})
        if path != "/v1/chat/completions":
            return Reply(404, {"detail": "Not Found"})
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise BadRequest("request body must be a JSON object")
            if request.get("model") != self.model:
                return _error(404, f"The model `{request.get('model')}` does not exist.", "NotFoundError")
            return Reply(200, self.complete(request))
        except (BadRequest, ValueError) as exc:
            return _error(400, str(exc), "BadRequestError")

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages")
        if not isinstance(messages, list) or len(messages) < 1:
            raise BadRequest("messages must be a non-empty list")
        xargs = request.get("vllm_xargs") or {}
        width, seed_canvas, children = self._check_xargs(request, xargs)
        label_ids = self._check_logprob_fields(request, xargs)
        # vLLM clamps max_tokens to the canvas for a read-only request.
        max_tokens = min(int(request.get("max_tokens") or width), width)
        if not xargs.get("diffusion_read_only") or seed_canvas is None or max_tokens < 2:
            raise BadRequest("stand-in: only read-only seeded reads (max_tokens >= 2) are served")
        one_step = bool(xargs.get("diffusion_read_only")) and xargs.get("diffusion_max_steps") == 1
        system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
        state = str(messages[-1].get("content", ""))
        question_id, labels, options = _parse_question(system)
        ids = [self._slot_id(question_id, label) for label in labels]
        choices = []
        for child in range(children):
            proba = self.reader.proba(state, options, seed=seed_canvas[max_tokens - 2] + child)
            if not one_step:
                proba = _sharpen(proba)
            slot = self._slot_logprobs(ids, proba, label_ids, request, xargs)
            content = [_echo(t) for t in seed_canvas[:max_tokens]]
            content[max_tokens - 2] = slot
            choices.append({"index": child, "finish_reason": "length",
                            "message": {"role": "assistant", "content": ""},
                            "logprobs": {"content": content}})
        return {"id": "chatcmpl-standin", "object": "chat.completion", "model": self.model,
                "choices": choices,
                "usage": {"prompt_tokens": len(system.split()) + len(state.split()),
                          "completion_tokens": max_tokens * children}}

    def _check_xargs(self, request: dict[str, Any], xargs: dict[str, Any]) -> tuple[int, list[int] | None, int]:
        """vLLM's admission checks of the diffusion fields, with its messages."""
        width = xargs.get("diffusion_canvas_length")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)
                                  or not 0 < width <= self.canvas_length):
            raise BadRequest("diffusion_canvas_length must be a positive integer no larger "
                             "than the served canvas.")
        expected = width or self.canvas_length
        seed_canvas = xargs.get("diffusion_seed_canvas")
        if seed_canvas is not None:
            if not isinstance(seed_canvas, list) or any(
                    isinstance(t, bool) or not isinstance(t, int) for t in seed_canvas):
                raise BadRequest("diffusion_seed_canvas must be a list of token ids.")
            if any(not 0 <= t < self.vocab_size for t in seed_canvas):
                raise BadRequest(f"diffusion_seed_canvas ids must be in [0, {self.vocab_size}).")
            if len(seed_canvas) != expected:
                raise BadRequest(f"diffusion_seed_canvas must hold exactly {expected} ids, "
                                 f"got {len(seed_canvas)}.")
        pinned = xargs.get("diffusion_pinned")
        if pinned is not None:
            if not isinstance(pinned, list) or any(
                    isinstance(p, bool) or not isinstance(p, int) for p in pinned):
                raise BadRequest("diffusion_pinned must be a list of canvas positions.")
            if seed_canvas is None:
                raise BadRequest("diffusion_pinned needs a diffusion_seed_canvas to hold.")
            if any(not 0 <= p < expected for p in pinned):
                raise BadRequest("diffusion_pinned positions must lie inside the canvas.")
        cap = xargs.get("diffusion_max_steps")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
            raise BadRequest("diffusion_max_steps must be a positive integer.")
        read_only = xargs.get("diffusion_read_only")
        if read_only is not None and read_only not in (0, 1):
            raise BadRequest("diffusion_read_only must be a boolean (or 0/1).")
        children = 1
        if "diffusion_samples" in xargs and self.engine_samples:
            children = xargs["diffusion_samples"]
            if not isinstance(children, int) or not 1 <= children <= self.max_samples:
                raise BadRequest(f"diffusion_samples must be in [1, {self.max_samples}], got {children}.")
            if seed_canvas is None or pinned is None:
                raise BadRequest("diffusion_samples needs a diffusion_seed_canvas and diffusion_pinned.")
            if int(request.get("n") or 1) > 1:
                raise BadRequest("diffusion_samples cannot be combined with n > 1.")
        return expected, seed_canvas, children

    def _check_logprob_fields(self, request: dict[str, Any], xargs: dict[str, Any]) -> list[int]:
        top = request.get("top_logprobs")
        if top is not None:
            if not request.get("logprobs"):
                raise BadRequest("top_logprobs requires logprobs to be set to true.")
            if not isinstance(top, int) or not 0 <= top <= self.max_logprobs:
                raise BadRequest(f"Requested top_logprobs of {top}, which is more than the "
                                 f"max_logprobs of {self.max_logprobs}.")
        ids = request.get("logprob_token_ids")
        if ids is not None:
            if not isinstance(ids, list) or len(ids) > LOGPROB_TOKEN_ID_CAP:
                raise BadRequest(f"logprob_token_ids may hold at most {LOGPROB_TOKEN_ID_CAP} ids.")
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
                   for t in ids):
                raise BadRequest(f"logprob_token_ids must be in [0, {self.vocab_size}).")
        constrained = xargs.get("diffusion_constrained")
        if constrained is not None and constrained not in (0, 1):
            raise BadRequest("diffusion_constrained must be a boolean (or 0/1).")
        if constrained and not ids:
            raise BadRequest("diffusion_constrained needs logprob_token_ids: they are the allowed set.")
        if not request.get("return_tokens_as_token_ids"):
            raise BadRequest("stand-in: set return_tokens_as_token_ids to read the slot")
        return list(ids or [])

    def _slot_id(self, question_id: str, label: str) -> int:
        """The token the model writes at the slot for ``label``: the last token of its answer line."""
        return int(self.tokenizer.encode(f"{question_id}: {label}", add_special_tokens=False)[-1])

    def _slot_logprobs(self, ids: list[int], proba: list[float], asked: list[int],
                       request: dict[str, Any], xargs: dict[str, Any]) -> dict[str, Any]:
        mass = 1.0 if xargs.get("diffusion_constrained") else LABEL_MASS
        logprobs = {t: math.log(max(p * mass, 1e-30)) for t, p in zip(ids, proba)}
        if mass < 1.0:  # the rest of the mass sits on two tokens that are not labels
            others = [t for t in range(len(self.tokenizer)) if t not in logprobs][:2]
            for t in others:
                logprobs[t] = math.log((1 - mass) / len(others))
        ranked = sorted(logprobs.items(), key=lambda kv: -kv[1])
        keep = dict(ranked[: int(request.get("top_logprobs") or 0)])
        keep.update({t: logprobs.get(t, OFF_SLOT_LOGPROB) for t in asked})
        top_id, top_lp = ranked[0]
        return {"token": f"token_id:{top_id}", "logprob": top_lp, "bytes": None,
                "top_logprobs": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None}
                                 for t, lp in sorted(keep.items(), key=lambda kv: -kv[1])]}


def _echo(token: int) -> dict[str, Any]:
    return {"token": f"token_id:{token}", "logprob": 0.0, "bytes": None,
            "top_logprobs": [{"token": f"token_id:{token}", "logprob": 0.0, "bytes": None}]}


def _parse_question(system: str) -> tuple[str, list[str], list[tuple[str, str | None]]]:
    """The question id, labels and options (name, description) listed in the system turn."""
    question_id, labels, options = None, [], []
    for line in system.splitlines():
        found = QUESTION_LINE.match(line)
        if found:
            question_id = found.group(1)
            continue
        match = OPTION_LINE.match(line)
        if match and question_id is not None:
            label, name, description = match.groups()
            labels.append(label)
            if label in ("yes", "no") and not description:  # a noul line: "  yes[: criterion]"
                options.append((label, name))
            else:
                options.append((name or label, description))
    if question_id is None or len(options) < 2:
        raise BadRequest("stand-in: the system turn lists no 'Question id:' with two or more "
                         "'  LABEL: option' lines")
    return question_id, labels, options


def _sharpen(proba: list[float]) -> list[float]:
    powered = [p ** CONVERGED_SHARPNESS for p in proba]
    total = sum(powered)
    return [p / total for p in powered]


def _error(status: int, message: str, kind: str) -> Reply:
    return Reply(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokenizer", type=Path, required=True, help="local tokenizer folder")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    parser.add_argument("--model", default="dgemma")
    parser.add_argument("--canvas", type=int, default=64)
    parser.add_argument("--max-per-class", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=ENGINE_VOCAB)
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer), local_files_only=True)
    reader = Banking77Reader(data_dir=args.data, max_per_class=args.max_per_class)
    server = VllmStandin(reader=reader, tokenizer=tokenizer, model=args.model,
                         canvas_length=args.canvas, vocab_size=args.vocab_size, host=args.host, port=args.port)
    print(f"vLLM stand-in on {server.url} (model {args.model})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
