"""Stand-in for the vLLM example server's ``POST /v1/systemone`` (protocol notes, sections 1-3):
validates a request as the example server does (2..26 alternatives, id rules, <= 64 questions,
samples, dependencies; 422 ``{"error": {"message", "type"}}``) and answers from a real model.

    python -m standins.systemone_server --port 8011 [--data ../shared/data/banking77]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from standins.harness import Reply, StandinServer
from standins.reader import Banking77Reader

MAX_QUESTIONS = 64
MAX_SAMPLES = 32
AUTO_DRAWS = 4
AUTO_THRESHOLD_NATS = 0.1


class SchemaError(Exception):
    """A request the example server answers with 422."""


class SystemOneStandin(StandinServer):
    def __init__(self, *, reader: Banking77Reader, model: str = "dgemma",
                 max_alternatives: int = 26, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reader = reader
        self.model = model
        self.max_alternatives = max_alternatives

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        if method == "GET":
            if path == "/health":
                return Reply(200, {"status": "ok"})
            return Reply(404, {"error": {"message": "unknown route"}})
        if path != "/v1/systemone":
            return Reply(404, {"error": {"message": "unknown route"}})
        try:
            request = json.loads(body)
            problem = "" if isinstance(request, dict) else "expected a JSON object"
        except ValueError as exc:
            problem = str(exc)
        if problem:
            return Reply(400, {"error": {"message": f"invalid body: {problem}",
                                         "type": "invalid_request_error"}})
        try:
            return Reply(200, self.decide(request))
        except SchemaError as exc:
            return Reply(422, {"error": {"message": str(exc), "type": "validation_error"}})

    def decide(self, request: dict[str, Any]) -> dict[str, Any]:
        if "state" not in request:
            raise SchemaError("state: required")
        state = request["state"]
        state_text = state if isinstance(state, str) else json.dumps(state)
        questions = request.get("questions")
        if not isinstance(questions, dict) or not questions:
            raise SchemaError("questions: needs a non-empty map of id -> question")
        if len(questions) > MAX_QUESTIONS:
            raise SchemaError(f"schema: at most {MAX_QUESTIONS} questions")
        samples = _samples(request.get("samples", "auto"))
        seed = int(request.get("seed", 42))
        parsed = {qid: self._question(qid, q) for qid, q in questions.items()}
        answers: dict[str, Any] = {}
        skipped: dict[str, Any] = {}
        for qid in _stage_order(parsed):
            question = parsed[qid]
            blocker = _failed_condition(question.get("ask_if") or {}, answers)
            if blocker is not None:
                answers[qid] = None
                skipped[qid] = blocker
                continue
            answers[qid] = self._answer(question, state_text, seed, samples)
        ordered = {qid: answers[qid] for qid in questions}
        return {
            "model": self.model,
            "answers": ordered,
            "usage": {"input_tokens": len(state_text.split()), "output_tokens": 2 * len(questions)},
            "diagnostics": {"engine": "standin", "skipped": skipped, "samples": samples},
        }

    def _question(self, qid: str, question: Any) -> dict[str, Any]:
        if not qid.strip() or ":" in qid or "\n" in qid:
            raise SchemaError(f"question {qid!r}: ids must be non-empty, without ':' or newline")
        if not isinstance(question, dict):
            raise SchemaError(f"question '{qid}': must be an object")
        kind = question.get("type")
        criteria = question.get("criteria")
        if kind == "choice":
            if not isinstance(criteria, dict) or not criteria:
                raise SchemaError(f"question '{qid}': criteria must map option names to descriptions")
            options = [(str(k), None if v is None else str(v)) for k, v in criteria.items()]
        elif kind == "score":
            if not isinstance(criteria, list):
                raise SchemaError(f"question '{qid}': criteria must list the levels")
            options = [(str(level), None) for level in criteria]
        elif kind == "noul":
            crit = criteria if isinstance(criteria, dict) else {}
            options = [("yes", crit.get("true")), ("no", crit.get("false"))]
        else:
            raise SchemaError(f"question '{qid}': unknown type '{kind}'")
        if len(options) < 2:
            raise SchemaError(f"question '{qid}': needs at least two alternatives")
        if len(options) > self.max_alternatives:
            raise SchemaError(f"question '{qid}': at most {self.max_alternatives} alternatives")
        return {"id": qid, "type": kind, "options": options, "depends_on": question.get("depends_on"),
                "ask_if": question.get("ask_if")}

    def _answer(self, question: dict[str, Any], state: str, seed: int, samples: int | None) -> Any:
        options = question["options"]
        draws = samples or 1
        proba = self.reader.proba(state, options, seed=seed, samples=draws)
        if samples is None and _entropy(proba) > AUTO_THRESHOLD_NATS and self.reader.noise > 0:
            proba = self.reader.proba(state, options, seed=seed, samples=AUTO_DRAWS)
        names = [name for name, _ in options]
        top = max(range(len(proba)), key=proba.__getitem__)
        if question["type"] == "noul":
            return {"type": "noul", "noul": proba[0]}
        if question["type"] == "score":
            return {"type": "score", "score": sum(i * p for i, p in enumerate(proba)),
                    "legend": {str(i): n for i, n in enumerate(names)},
                    "probabilities": {str(i): p for i, p in enumerate(proba)},
                    "confidence": proba[top]}
        return {"type": "choice", "choice": names[top],
                "probabilities": dict(zip(names, proba)), "confidence": proba[top]}


def _samples(value: Any) -> int | None:
    """None for "auto", else the capped count; 422 for anything else."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchemaError('schema: samples must be a positive count or "auto"')
    return min(value, MAX_SAMPLES)


def _stage_order(questions: dict[str, dict[str, Any]]) -> list[str]:
    """Questions after everything they depend on (depends_on and ask_if keys)."""
    deps: dict[str, set[str]] = {}
    for qid, q in questions.items():
        ask_if = q["ask_if"]
        if ask_if is not None and (not isinstance(ask_if, dict) or
                                   not all(isinstance(v, list) and v for v in ask_if.values())):
            raise SchemaError("ask_if must map a question id to a non-empty list of its answers")
        wanted = set(q["depends_on"] or []) | set(ask_if or {})
        if not wanted <= set(questions) or qid in wanted:
            raise SchemaError(f"question '{qid}': depends on unknown question")
        deps[qid] = wanted
    order: list[str] = []
    while len(order) < len(questions):
        ready = [q for q in questions if q not in order and deps[q] <= set(order)]
        if not ready:
            rest = sorted(set(questions) - set(order))
            raise SchemaError(f"schema: dependency cycle among {', '.join(rest)}")
        order += ready
    return order


def _failed_condition(ask_if: dict[str, list[str]], answers: dict[str, Any]) -> dict[str, Any] | None:
    for dep, wanted in ask_if.items():
        answer = answers.get(dep)
        was = None
        if answer is not None:
            if answer["type"] == "noul":
                was = "yes" if answer["noul"] >= 0.5 else "no"
            elif answer["type"] == "score":
                was = answer["legend"][max(answer["probabilities"], key=answer["probabilities"].get)]
            else:
                was = answer["choice"]
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
    args = parser.parse_args(argv)
    reader = Banking77Reader(data_dir=args.data, max_per_class=args.max_per_class, noise=args.noise)
    server = SystemOneStandin(reader=reader, model=args.model, max_alternatives=args.max_alternatives,
                              host=args.host, port=args.port, api_key=args.api_key)
    print(f"System One stand-in on {server.url} (model {args.model})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
