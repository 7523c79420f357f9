"""Fuzzing: schemathesis generates requests from the server's own OpenAPI document (every route,
valid and invalid bodies) and sends them to the live server on loopback. No response is a 5xx,
and every 4xx carries an error body in its route's dialect: OpenAI's {"error": {message, type,
param, code}} everywhere but /v1/systemone, whose dialect is {"error": {message, type}}.
At least 1,000 requests in total (counted, asserted); seeds are fixed (derandomized)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode

from router.backends.mock import MockBackend
from standins.llm import StandinHandle
from tests.reliability.conftest import LiveServer, Switch, settings_for

MIN_REQUESTS = 1000
# Examples per (POST operation, mode); GET routes take no input and are covered by a handful.
EXAMPLES_PER_BODY_MODE = 180
EXAMPLES_GET = 5


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    standin.set_mode("ok")
    settings = settings_for(standin, tmp_path_factory.mktemp("fuzz"), slow={"timeout_s": 5})
    with LiveServer(settings, backend=MockBackend(Switch())) as running:
        yield running


def check(method: str, path: str, response: requests.Response) -> None:
    where = f"{method} {path} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    if response.status_code < 400:
        return
    body = response.json()
    assert set(body) == {"error"}, where
    error: dict[str, Any] = body["error"]
    assert isinstance(error.get("message"), str) and error["message"], where
    assert isinstance(error.get("type"), str) and error["type"], where
    if path.startswith("/v1/systemone"):
        assert set(error) == {"message", "type"}, where
    else:
        assert set(error) == {"message", "type", "param", "code"}, where


@pytest.mark.long
def test_schema_fuzz_every_route(server: LiveServer) -> None:
    # schemathesis is imported above, at collection, while no other thread runs: pytest parses
    # its modules to rewrite them, and a parse meeting another thread's fails without the
    # parse lock.
    schema = schemathesis.openapi.from_dict(server.app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    counts: Counter[str] = Counter()
    session = requests.Session()

    def run(operation: Any, mode: Any, label: str, max_examples: int) -> None:
        @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case: Any) -> None:
            response = case.call(base_url=server.url, session=session, timeout=30)
            counts[label] += 1
            counts[f"status {response.status_code}"] += 1
            check(case.method, case.path, response)

        fuzz()

    for operation in operations:
        has_body = operation.method.upper() == "POST"
        for mode in list(GenerationMode) if has_body else [GenerationMode.POSITIVE]:
            run(operation, mode, f"{operation.method.upper()} {operation.path} {mode.value}",
                EXAMPLES_PER_BODY_MODE if has_body else EXAMPLES_GET)
    session.close()
    total = sum(v for k, v in counts.items() if not k.startswith("status"))
    print(f"fuzz: {total} requests; " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    assert {op.path for op in operations} == {
        "/v1/chat/completions", "/v1/feedback", "/v1/models", "/v1/systemone",
        "/healthz", "/readyz", "/metrics"}
    assert total >= MIN_REQUESTS
    assert counts["status 200"] > 0 and sum(
        v for k, v in counts.items() if k.startswith("status 4")) > 0  # both sides were reached


# ---- decision-shaped bodies: the OpenAPI document types response_format's schema as a free
# object, so schemathesis rarely builds a decision; these strategies aim at the decision paths.

def _decision_strategies() -> Any:
    """Wild bodies (any field may be wrong) and well-formed decisions with arbitrary options,
    states and shapes (enum, object of enums, structured_outputs.choice, guided_choice)."""
    from hypothesis import strategies as st

    text = st.text(max_size=12)
    wild_options = st.lists(text | st.integers() | st.none(), max_size=6)
    options = st.lists(text.filter(str.strip), min_size=2, max_size=6, unique=True)
    content = text | st.none() | st.lists(st.fixed_dictionaries({"text": text}), max_size=2)
    wild_messages = st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "wizard"]),
         "content": content}), max_size=3)
    messages = st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"]), "content": st.text(min_size=1)}),
        min_size=1, max_size=3)

    def enum_schema(opts: Any) -> Any:
        return st.fixed_dictionaries({"type": st.just("string"), "enum": opts})

    def formats(opts: Any) -> Any:
        ids = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
        object_schema = st.fixed_dictionaries({"type": st.just("object"), "properties":
                                               st.dictionaries(ids, enum_schema(opts),
                                                               min_size=1, max_size=3)})
        return st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema":
                                      st.fixed_dictionaries({"name": ids, "schema":
                                                             enum_schema(opts) | object_schema})})

    wild = st.fixed_dictionaries(
        {"model": st.sampled_from(["m", "", "openai/standin"]), "messages": wild_messages},
        optional={"response_format": formats(wild_options) | st.fixed_dictionaries(
                      {"type": st.sampled_from(["json_object", "text", "xml"])}),
                  "guided_choice": wild_options,
                  "structured_outputs": st.fixed_dictionaries({"choice": wild_options}),
                  "stream": st.booleans(), "n": st.integers(-1, 3),
                  "slotgate": st.fixed_dictionaries({}, optional={"policy": text | st.none()})})
    shaped = st.one_of(
        st.fixed_dictionaries({"response_format": formats(options)}),
        st.fixed_dictionaries({"guided_choice": options}),
        st.fixed_dictionaries({"structured_outputs": st.fixed_dictionaries({"choice": options})}),
    ).flatmap(lambda shape: st.fixed_dictionaries(
        {"model": st.just("m"), "messages": messages, **{k: st.just(v) for k, v in shape.items()}},
        optional={"stream": st.booleans()}))
    return shaped | wild


def test_decision_bodies_fuzz(server: LiveServer) -> None:
    from hypothesis import strategies as st

    session = requests.Session()
    counts: Counter[str] = Counter()

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=_decision_strategies() | st.builds(dict))
    def fuzz(body: dict[str, Any]) -> None:
        response = session.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
        check("POST", "/v1/chat/completions", response)
        counts[str(response.status_code)] += 1
        if response.status_code == 200 and not body.get("stream"):
            reply = response.json()
            if "slotgate" in reply:  # a decision: its answer is one of the asked options
                counts["decisions"] += 1
                content = reply["choices"][0]["message"]["content"]
                if "response_format" not in body:  # vLLM choice: the bare option, as vLLM does
                    choices = body.get("guided_choice") or body["structured_outputs"]["choice"]
                    assert content in choices
                    return
                answer = json.loads(content)  # a JSON value satisfying the schema
                asked = json.dumps(body)
                for value in answer.values() if isinstance(answer, dict) else [answer]:
                    assert json.dumps(value) in asked

    fuzz()
    session.close()
    print(f"decision fuzz: {dict(counts)}")
    assert counts["decisions"] >= 10 and sum(counts.values()) - counts["decisions"] >= 150


def test_systemone_bodies_fuzz(server: LiveServer) -> None:
    """S1's parser strategies (tests/router/http/systemone/test_fuzz.py), sent through the live
    server: the parser property holds end to end, error handler and routing included."""
    from tests.router.http.systemone.test_fuzz import payloads, plausible

    session = requests.Session()
    counts: Counter[int] = Counter()

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=payloads | plausible)
    def fuzz(body: dict[str, Any]) -> None:
        response = session.post(f"{server.url}/v1/systemone", json=body, timeout=30)
        check("POST", "/v1/systemone", response)
        counts[response.status_code] += 1
        if response.status_code == 200:
            answers = response.json()["answers"]
            assert set(answers) <= set(body["questions"])  # ("ask" may choose fewer)

    fuzz()
    session.close()
    print(f"systemone fuzz: {dict(counts)}")
    assert counts[200] >= 10 and sum(counts.values()) >= 150
