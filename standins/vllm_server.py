"""Stand-in for vLLM's OpenAI chat API serving DiffusionGemma with diffusion reads: validates the
diffusion request fields as vLLM does (protocol notes, section 5; 400 with vLLM's messages) and
answers with logprobs at the answer slot, in vLLM's chat logprobs shape ("token_id:N" tokens).

Stand-in conventions (a real model needs none): the slot is the last position before the turn
close, i.e. ``max_tokens - 2``; options are parsed from the system turn's ``  LABEL: name (desc)``
lines; the answer comes from the BANKING77 reader. Other positions echo their seed token.

    python -m standins.vllm_server --port 8000 --tokenizer PATH [--data ../shared/data/banking77]
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

from standins.harness import Reply, StandinServer
from standins.reader import Banking77Reader

OPTION_LINE = re.compile(r"^  (\S+): (.+?)(?: \((.*)\))?$")
LOGPROB_TOKEN_ID_CAP = 128
LABEL_MASS = 0.9  # unconstrained reads leave some mass on non-label tokens, as a real model does


class BadRequest(Exception):
    pass


class VllmStandin(StandinServer):
    def __init__(self, *, reader: Banking77Reader, tokenizer: Any, model: str = "dgemma",
                 canvas_length: int = 64, max_logprobs: int = 32, max_samples: int = 8,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reader = reader
        self.tokenizer = tokenizer
        self.model = model
        self.canvas_length = canvas_length
        self.max_logprobs = max_logprobs
        self.max_samples = max_samples
        self.vocab_size = len(tokenizer)

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        if method == "GET":
            if path == "/health":
                return Reply(200, "")
            if path == "/v1/models":
                return Reply(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
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
        max_tokens = min(int(request.get("max_tokens") or width), width)
        if not xargs.get("diffusion_read_only") or seed_canvas is None or max_tokens < 2:
            raise BadRequest("stand-in: only read-only seeded reads (max_tokens >= 2) are served")
        system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
        state = str(messages[-1].get("content", ""))
        labels, options = _parse_options(system)
        ids = [self._label_id(label) for label in labels]
        choices = []
        for child in range(children):
            proba = self.reader.proba(state, options, seed=seed_canvas[max_tokens - 2] + child)
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
        width = xargs.get("diffusion_canvas_length", self.canvas_length)
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= self.canvas_length:
            raise BadRequest(f"diffusion_canvas_length must be in [1, {self.canvas_length}], got {width}.")
        seed_canvas = xargs.get("diffusion_seed_canvas")
        if seed_canvas is not None:
            if not isinstance(seed_canvas, list) or len(seed_canvas) != width:
                got = len(seed_canvas) if isinstance(seed_canvas, list) else type(seed_canvas).__name__
                raise BadRequest(f"diffusion_seed_canvas must hold exactly {width} ids, got {got}.")
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
                   for t in seed_canvas):
                raise BadRequest(f"diffusion_seed_canvas ids must be in [0, {self.vocab_size}).")
        if "diffusion_read_only" in xargs and not isinstance(xargs["diffusion_read_only"], bool):
            raise BadRequest("diffusion_read_only must be a boolean.")
        pinned = xargs.get("diffusion_pinned")
        if pinned is not None:
            if seed_canvas is None:
                raise BadRequest("diffusion_pinned needs a diffusion_seed_canvas to hold.")
            if not isinstance(pinned, list) or any(not isinstance(p, int) or not 0 <= p < width
                                                   for p in pinned):
                raise BadRequest(f"diffusion_pinned positions must be in [0, {width}).")
        children = xargs.get("diffusion_samples", 1)
        if "diffusion_samples" in xargs:
            if not isinstance(children, int) or not 1 <= children <= self.max_samples:
                raise BadRequest(f"diffusion_samples must be in [1, {self.max_samples}], got {children}.")
            if seed_canvas is None or pinned is None:
                raise BadRequest("diffusion_samples needs a diffusion_seed_canvas and diffusion_pinned.")
            if int(request.get("n") or 1) > 1:
                raise BadRequest("diffusion_samples cannot be combined with n > 1.")
        return width, seed_canvas, children

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
        if xargs.get("diffusion_constrained") and not ids:
            raise BadRequest("diffusion_constrained needs logprob_token_ids to constrain to.")
        if not request.get("return_tokens_as_token_ids"):
            raise BadRequest("stand-in: set return_tokens_as_token_ids to read the slot")
        return list(ids or [])

    def _label_id(self, label: str) -> int:
        ids = self.tokenizer.encode(label, add_special_tokens=False)
        if len(ids) != 1:
            raise BadRequest(f"stand-in: label {label!r} is not a single token")
        return int(ids[0])

    def _slot_logprobs(self, ids: list[int], proba: list[float], asked: list[int],
                       request: dict[str, Any], xargs: dict[str, Any]) -> dict[str, Any]:
        mass = 1.0 if xargs.get("diffusion_constrained") else LABEL_MASS
        logprobs = {t: math.log(max(p * mass, 1e-30)) for t, p in zip(ids, proba)}
        if mass < 1.0:  # the rest of the mass sits on two tokens that are not labels
            others = [t for t in range(self.vocab_size) if t not in logprobs][:2]
            for t in others:
                logprobs[t] = math.log((1 - mass) / len(others))
        ranked = sorted(logprobs.items(), key=lambda kv: -kv[1])
        keep = dict(ranked[: int(request.get("top_logprobs") or 0)])
        keep.update({t: logprobs.get(t, math.log(1e-30)) for t in asked})
        top_id, top_lp = ranked[0]
        return {"token": f"token_id:{top_id}", "logprob": top_lp, "bytes": None,
                "top_logprobs": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None}
                                 for t, lp in sorted(keep.items(), key=lambda kv: -kv[1])]}


def _echo(token: int) -> dict[str, Any]:
    return {"token": f"token_id:{token}", "logprob": 0.0, "bytes": None,
            "top_logprobs": [{"token": f"token_id:{token}", "logprob": 0.0, "bytes": None}]}


def _parse_options(system: str) -> tuple[list[str], list[tuple[str, str | None]]]:
    labels, options = [], []
    for line in system.splitlines():
        match = OPTION_LINE.match(line)
        if match:
            labels.append(match.group(1))
            options.append((match.group(2), match.group(3)))
    if len(options) < 2:
        raise BadRequest("stand-in: the system turn lists fewer than two '  LABEL: option' lines")
    return labels, options


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
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer), local_files_only=True)
    reader = Banking77Reader(data_dir=args.data, max_per_class=args.max_per_class)
    server = VllmStandin(reader=reader, tokenizer=tokenizer, model=args.model,
                         canvas_length=args.canvas, host=args.host, port=args.port)
    print(f"vLLM stand-in on {server.url} (model {args.model})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
