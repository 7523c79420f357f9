"""Stand-in for the vLLM example server's ``POST /v1/systemone`` (protocol notes, sections 1-3):
validates a request as the example server does (2..26 alternatives, id rules, <= 64 questions,
samples, dependencies, engine knobs, an answer template that must fit the canvas; 422
``{"error": {"message", "type"}}``; the key before anything else) and answers from a real model.

Where the server's behaviour shows through to a client, the stand-in has it too: ids are trimmed;
non-string levels, descriptions and criteria are read as text; the questions of a stage are read
jointly, and joint slots copy letters (protocol notes, section 7): each later question of a joint
read moves ``JOINT_COPY`` of its mass to the label position the question before it chose, so a
question asked alone and asked beside others get different probabilities, as on the server.
A body of several stages is "chained" there: every stage's prompt lists every question, and a later
stage continues the answers the server gave (prefilled after the prompt). The stand-in's model
reads text, so it reads those as text: in a chained body each read sees the state followed by the
question lines and then the earlier answers (``id: name``); the probabilities move with them, as
the server's do, and a stage read on its own gets other ones.
Token counts use ``BYTES_PER_TOKEN`` (no tokenizer here). Span questions, ``think`` and images
follow the server at mmastrac/djev 28b1e26 (``standins/spans.py``).

Everything else goes to ``upstream`` (an OpenAI-compatible server: standins/llm.py in tests) as the
server sends it to its vLLM: ``GET /v1/models`` relayed; a ``/v1/chat/completions`` that is not a
structured read (first message a system or developer message whose text is a JSON object with
``questions``), ``/v1/raw/chat/completions`` and every other ``/v1/...`` POST relayed as sent,
status, content type and body, the body streamed as it arrives; an unreachable upstream is a 503.
Two differences: the stand-in answers structured reads on ``/v1/systemone`` only (a structured
chat gets a 400 saying so), and it sends a chat with ``tool_choice`` "required" or a named
function as it is (the server pins the call's opening on a diffusion canvas first).

    python -m standins.systemone_server --port 8011 [--data ../shared/data/banking77]
        [--upstream http://127.0.0.1:8090]
"""

from __future__ import annotations

import argparse
import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from standins.harness import Reply, StandinServer
from standins.reader import Banking77Reader
from standins.spans import (
    SPAN_KINDS,
    StandinSchemaError,
    answer_span,
    json_images,
    read_form,
    span_config,
    span_source,
    thought,
)
from standins.vllm_server import model_list

MAX_QUESTIONS = 64
MAX_SAMPLES = 32
CANVAS_LENGTH = 64
SCAFFOLD_ROWS = 10  # the empty thought block, in DiffusionGemma tokens
BYTES_PER_TOKEN = 3  # a rough count for the answer line "{id}: {label}"
JOINT_COPY = 0.25
AUTO_DRAWS = 4
AUTO_THRESHOLD_NATS = 0.1


SchemaError = StandinSchemaError  # a request the example server answers with 422


class SystemOneStandin(StandinServer):
    def __init__(self, *, reader: Banking77Reader, model: str = "dgemma",
                 max_alternatives: int = 26, upstream: str | None = None,
                 upstream_root: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reader = reader
        self.model = model
        self.max_alternatives = max_alternatives
        self.upstream = upstream  # the OpenAI-compatible server relayed requests go to
        self.images_seen: list[list[str]] = []  # the images of each decision, as data URLs
        # None: the snapshot server (any GET but /health is a 404); a weights path: djev, which
        # passes GET /v1/models through to the vLLM behind it
        self.upstream_root = upstream_root

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        return self.handle_typed(method, path, body, "application/json")

    def handle_typed(self, method: str, path: str, body: bytes, content_type: str) -> Reply:
        if method == "GET":
            if path == "/health":
                return Reply(200, {"status": "ok"})
            if path == "/v1/models" and self.upstream is not None:
                return relay_models(self.upstream)
            if path == "/v1/models" and self.upstream_root is not None:
                return Reply(200, model_list(self.model, self.upstream_root, 8192))
            return Reply(404, {"error": {"message": "unknown route"}})
        if path == "/v1/raw/chat/completions":
            return relay(self.upstream, "/v1/chat/completions", body)
        if path != "/v1/systemone":
            return other_post(self.upstream, path, body)
        images: list[str] = []
        try:
            if content_type.lower().startswith("multipart/form-data"):
                request, images = read_form(body, content_type)
            else:
                request = json.loads(body)
            problem = "" if isinstance(request, dict) else "expected a JSON object"
        except ValueError as exc:
            problem = str(exc)
        if problem:
            return Reply(400, {"error": {"message": f"invalid body: {problem}",
                                         "type": "invalid_request_error"}})
        try:
            return Reply(200, self.decide(request, images))
        except SchemaError as exc:
            return Reply(422, {"error": {"message": str(exc), "type": "validation_error"}})

    def decide(self, request: dict[str, Any], form_images: list[str] | None = None
               ) -> dict[str, Any]:
        if "state" not in request:
            raise SchemaError("state: required")
        state = request["state"]
        # The model reads non-ASCII text as itself (the server's ensure_ascii=False).
        state_text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
        images = (form_images or []) + json_images(request.get("images"))
        self.images_seen.append(images)
        questions = request.get("questions")
        if not isinstance(questions, dict) or not questions:
            raise SchemaError("questions: needs a non-empty map of id -> question")
        if len(questions) > MAX_QUESTIONS:
            raise SchemaError(f"schema: at most {MAX_QUESTIONS} questions")
        samples = _samples(request.get("samples", "auto"))
        auto = (max(1, min(int(request.get("auto_max", AUTO_DRAWS)), MAX_SAMPLES)),
                float(request.get("auto_threshold", AUTO_THRESHOLD_NATS)))
        _check_knobs(request)
        seed = int(request.get("seed", 42))
        parsed: dict[str, dict[str, Any]] = {}
        for qid, q in questions.items():
            question = self._question(qid, q)
            if question["id"] in parsed:
                raise SchemaError(f"duplicate question id {question['id']!r}")
            parsed[question["id"]] = question
        spans = {qid: q for qid, q in parsed.items() if q["type"] in SPAN_KINDS}
        for qid, q in parsed.items():
            for dep in [*(q["depends_on"] or []), *(q["ask_if"] or {})]:
                if dep in spans:
                    raise SchemaError(f"question {qid!r}: cannot depend on the span question "
                                      f"{dep!r}")
        source = span_source(state, state_text)
        if spans and not source.strip():
            raise SchemaError("a span question needs a text state to point into")
        span_answers = {qid: answer_span(q, source) for qid, q in spans.items()}
        parsed = {qid: q for qid, q in parsed.items() if qid not in spans}
        stages = _stages(parsed)
        _check_answer_names(parsed)
        answers: dict[str, Any] = {}
        skipped: dict[str, Any] = {}
        chained = len(stages) > 1
        # A chained body's prompt lists every question; later stages continue earlier answers.
        prompt = state_text + "".join(
            f"\nQuestion {q['id']}: {q['instructions']}" for q in parsed.values()) if chained \
            else state_text
        earlier: list[str] = []
        asked_stages: list[list[str]] = []
        for stage in stages:
            asked = []
            for qid in stage:
                blocker = _failed_condition(parsed[qid].get("ask_if") or {}, answers)
                if blocker is None:
                    asked.append(qid)
                else:
                    answers[qid] = None
                    skipped[qid] = blocker
            if not asked:
                continue
            text = prompt + "".join(f"\n{line}" for line in earlier)
            previous_top: int | None = None
            for qid in asked:  # one joint read per stage; an `alone` question reads on its own
                alone = parsed[qid]["alone"]
                answers[qid], top = self._answer(parsed[qid], text, seed, samples,
                                                 None if alone else previous_top, auto)
                previous_top = previous_top if alone else top
            earlier += [f"{qid}: {_answer_name(answers[qid])}" for qid in asked]
            asked_stages.append(asked)
        answers.update(span_answers)
        diagnostics: dict[str, Any] = {
            "engine": "standin", "stages": asked_stages, "skipped": skipped,
            "conditioning": "prefill" if len(asked_stages) > 1 else None, "samples": samples}
        if parsed:  # a decision of span questions alone has no thought (the server's too)
            diagnostics["thought"] = thought(request.get("think", 0), state_text)
        if spans:
            diagnostics["spans"] = {"steps": 4, "reads": sum(a["reads"] for a in
                                                            span_answers.values()),
                                    "source": "state" if not images else "text part"}
        return {
            "model": self.model,
            "answers": {str(qid).strip(): answers[str(qid).strip()] for qid in questions},
            "usage": {"input_tokens": len(state_text.split()), "output_tokens": 2 * len(questions)},
            "diagnostics": diagnostics,
        }

    def _question(self, raw_id: str, question: Any) -> dict[str, Any]:
        qid = str(raw_id).strip()  # the server trims ids, and answers under the trimmed id
        if not qid or ":" in qid or "\n" in qid:
            raise SchemaError(f"question id {qid!r} must be non-empty, no ':' or newline")
        if not isinstance(question, dict):
            raise SchemaError(f"question {qid!r}: must be an object")
        kind = question.get("type")
        criteria = question.get("criteria")
        if kind in SPAN_KINDS:
            text = question.get("instructions", "")
            return {"id": qid, "type": kind, "span": span_config(qid, question), "options": [],
                    "depends_on": None, "ask_if": None, "alone": False,
                    "instructions": text if isinstance(text, str) else json.dumps(text)}
        if kind == "choice":
            if not isinstance(criteria, dict) or not criteria:
                raise SchemaError(f"question {qid!r}: choice criteria must map option names "
                                  "to descriptions")
            options = [(str(k), None if v is None else _text(v)) for k, v in criteria.items()]
        elif kind == "score":
            if not isinstance(criteria, list):
                raise SchemaError(f"question {qid!r}: score criteria must be an ordered list of levels")
            options = [(str(level), None) for level in criteria]
        elif kind == "noul":
            if criteria is not None and not isinstance(criteria, dict):
                raise SchemaError(f"question {qid!r}: noul criteria must be an object with "
                                  "true and false")
            crit = criteria or {}
            options = [("yes", _text(crit.get("true"))), ("no", _text(crit.get("false")))]
        else:
            raise SchemaError(f"question {qid!r}: unknown type {kind!r}")
        if len(options) < 2:
            raise SchemaError(f"question {qid!r}: needs at least two alternatives")
        if len(options) > self.max_alternatives:
            raise SchemaError(f"question {qid!r}: at most {self.max_alternatives} alternatives")
        rows = SCAFFOLD_ROWS + -(-len(f"{qid}: A".encode()) // BYTES_PER_TOKEN)
        if rows + 1 > CANVAS_LENGTH:
            raise SchemaError(f"answer template is {rows} tokens; the canvas holds {CANVAS_LENGTH - 1}")
        depends_on = question.get("depends_on")
        if depends_on is not None and (not isinstance(depends_on, list) or
                                       not all(isinstance(d, str) for d in depends_on)):
            raise SchemaError(f"question {qid!r}: depends_on must be a list of question ids")
        return {"id": qid, "type": kind, "options": options, "depends_on": depends_on,
                "alone": bool(question.get("alone", False)),
                "ask_if": question.get("ask_if"), "instructions": str(question.get("instructions", ""))}

    def _answer(self, question: dict[str, Any], state: str, seed: int, samples: int | None,
                previous_top: int | None,
                auto: tuple[int, float] = (AUTO_DRAWS, AUTO_THRESHOLD_NATS)) -> tuple[Any, int]:
        options = question["options"]
        draws = samples or 1
        proba = self.reader.proba(state, options, seed=seed, samples=draws)
        auto_max, auto_threshold = auto
        if (samples is None and _entropy(proba) > auto_threshold and auto_max > 1
                and self.reader.noise > 0):
            proba = self.reader.proba(state, options, seed=seed, samples=auto_max)
        if previous_top is not None and previous_top < len(proba):  # joint slots copy letters
            proba = [(1 - JOINT_COPY) * p for p in proba]
            proba[previous_top] += JOINT_COPY
        names = [name for name, _ in options]
        top = max(range(len(proba)), key=proba.__getitem__)
        if question["type"] == "noul":
            return {"type": "noul", "noul": proba[0]}, top
        if question["type"] == "score":
            return {"type": "score", "score": sum(i * p for i, p in enumerate(proba)),
                    "legend": {str(i): n for i, n in enumerate(names)},
                    "probabilities": {str(i): p for i, p in enumerate(proba)},
                    "confidence": proba[top]}, top
        return {"type": "choice", "choice": names[top],
                "probabilities": dict(zip(names, proba)), "confidence": proba[top]}, top


def other_post(upstream: str | None, path: str, body: bytes) -> Reply:
    """A POST other than ``/v1/systemone``, routed as the example server routes it."""
    try:
        request = json.loads(body)
    except ValueError as exc:
        return Reply(400, {"error": {"message": f"invalid body: {exc}",
                                     "type": "invalid_request_error"}})
    if path == "/v1/chat/completions" and is_structured(request):
        return Reply(400, {"error": {"message": "the stand-in reads structured requests on "
                                                "/v1/systemone only", "type": "invalid_request_error"}})
    if path.startswith("/v1/"):
        return relay(upstream, path, body)
    return Reply(404, {"error": {"message": "unknown route"}})


def is_structured(request: Any) -> bool:
    """The server's test: the first message is a system (or developer) message whose text is a
    JSON object with a "questions" key."""
    messages = request.get("messages") if isinstance(request, dict) else None
    first = messages[0] if isinstance(messages, list) and messages else None
    if not isinstance(first, dict) or first.get("role") not in ("system", "developer"):
        return False
    content = first.get("content", "")
    text = "".join(p.get("text", "") for p in content if isinstance(p, dict)) \
        if isinstance(content, list) else content if isinstance(content, str) else ""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and "questions" in value


def relay(upstream: str | None, path: str, body: bytes) -> Reply:
    """``POST upstream+path`` with the body as sent; the upstream's status, content type and
    body come back, the body streamed as it arrives."""
    if upstream is None:
        return _unavailable("no upstream configured")
    request = urllib.request.Request(upstream.rstrip("/") + path, data=body,
                                     headers={"content-type": "application/json"})
    try:
        response = urllib.request.urlopen(request, timeout=600)
    except urllib.error.HTTPError as exc:
        response = exc
    except OSError as exc:
        return _unavailable(str(exc))
    headers = {"content-type": response.headers.get("content-type", "application/json")}
    if response.headers.get("content-length"):
        headers["content-length"] = response.headers["content-length"]
    return Reply(response.code, _chunks(response), headers)


def _chunks(response: Any) -> Iterator[bytes]:
    with response:
        while chunk := response.read1(65536):
            yield chunk


def relay_models(upstream: str | None) -> Reply:
    """``GET /v1/models`` passed to the upstream: its status and body."""
    if upstream is None:
        return _unavailable("no upstream configured")
    try:
        with urllib.request.urlopen(upstream.rstrip("/") + "/v1/models", timeout=10) as response:
            code, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        code, body = exc.code, exc.read()
    except OSError as exc:
        return _unavailable(str(exc))
    return Reply(code, body, {"content-type": "application/json"})


def _unavailable(why: str) -> Reply:
    return Reply(503, {"error": {"message": f"upstream unavailable: {why}"}})


def _text(value: Any) -> str | None:
    """A description as the server prints it: text as given, anything else through str()."""
    return None if value is None else str(value)


def _check_knobs(request: dict[str, Any]) -> None:
    """The example server's checks of its engine knobs."""
    chunk_rows = request.get("chunk_rows")
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 8):
        raise SchemaError("schema: chunk_rows must be an integer of at least 8")
    if request.get("chunk_prompt", "own") not in ("shared", "own"):
        raise SchemaError('schema: chunk_prompt must be "shared" or "own"')
    think = request.get("think", 0)
    if isinstance(think, bool) or not isinstance(think, int) or not 0 <= think <= 4096:
        raise SchemaError("schema: think must be a thought budget in tokens, 0 to 4096")


def _samples(value: Any) -> int | None:
    """None for "auto", else the capped count; 422 for anything else."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchemaError('schema: samples must be a positive count or "auto"')
    return min(value, MAX_SAMPLES)


def _stages(questions: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Questions in stages: each after everything it depends on (depends_on and ask_if keys),
    request order kept within a stage."""
    deps: dict[str, set[str]] = {}
    for qid, q in questions.items():
        ask_if = q["ask_if"]
        if ask_if is not None and (not isinstance(ask_if, dict) or
                                   not all(isinstance(v, list) and v for v in ask_if.values())):
            raise SchemaError(f"question {qid!r}: ask_if must map a question id to a non-empty "
                              "list of its answers")
        wanted = set(q["depends_on"] or []) | set(ask_if or {})
        if not wanted <= set(questions) or qid in wanted:
            raise SchemaError(f"question {qid!r}: depends on unknown question")
        deps[qid] = wanted
    stages: list[list[str]] = []
    done: set[str] = set()
    while len(done) < len(questions):
        ready = [q for q in questions if q not in done and deps[q] <= done]
        if not ready:
            rest = [q for q in questions if q not in done]
            raise SchemaError(f"schema: dependency cycle among {', '.join(rest)}")
        stages.append(ready)
        done.update(ready)
    return stages


def _check_answer_names(questions: dict[str, dict[str, Any]]) -> None:
    """``ask_if`` may only want answers its dependency can give (checked once every id is known)."""
    for qid, q in questions.items():
        for dep, wanted in (q["ask_if"] or {}).items():
            if dep not in questions or not isinstance(wanted, list):
                continue  # _stages names these
            names = [name for name, _ in questions[dep]["options"]]
            if any(v not in names for v in wanted):
                raise SchemaError(f"question {qid!r}: ask_if values for {dep!r} must be among {names}")


def _answer_name(answer: dict[str, Any] | None) -> str | None:
    """The answer the server continues and ``ask_if`` compares: yes/no, the option, the level."""
    if answer is None:
        return None
    if answer["type"] == "noul":
        return "yes" if answer["noul"] >= 0.5 else "no"
    if answer["type"] == "score":
        return str(answer["legend"][max(answer["probabilities"], key=answer["probabilities"].get)])
    return str(answer["choice"])


def _failed_condition(ask_if: dict[str, list[str]], answers: dict[str, Any]) -> dict[str, Any] | None:
    for dep, wanted in ask_if.items():
        was = _answer_name(answers.get(dep))
        if was not in wanted:
            return {"because": dep, "was": was, "wanted": wanted}
    return None


def _entropy(proba: list[float]) -> float:
    return -sum(p * math.log(p) for p in proba if p > 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    parser.add_argument("--model", default="dgemma")
    parser.add_argument("--max-alternatives", type=int, default=26)
    parser.add_argument("--max-per-class", type=int, default=None)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--upstream", default=None,
                        help="OpenAI-compatible server for relayed requests (standins.llm)")
    args = parser.parse_args(argv)
    reader = Banking77Reader(data_dir=args.data, max_per_class=args.max_per_class, noise=args.noise)
    server = SystemOneStandin(reader=reader, model=args.model, max_alternatives=args.max_alternatives,
                              host=args.host, port=args.port, api_key=args.api_key,
                              upstream=args.upstream)
    print(f"System One stand-in on {server.url} (model {args.model})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
