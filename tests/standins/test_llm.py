"""standins/llm.py, the slow path's stand-in: answers within the enum options (by rule or by
a scikit-learn model), echoes and streams plain chats, records calls, fails on command, and runs
on its own as a script."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import joblib
import pytest

from standins.llm import StandinHandle, rule_chooser, start_standin
from tests.conftest import ROOT, free_port


def enum_body(options: list[str], text: str, *, shape: str = "object") -> dict[str, Any]:
    if shape == "object":
        schema: dict[str, Any] = {"type": "object", "properties": {
            "answer": {"type": "string", "enum": options}}, "required": ["answer"]}
    else:
        schema = {"type": "string", "enum": options}
    return {"model": "standin", "messages": [{"role": "user", "content": text}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "d", "schema": schema, "strict": True}}}


def content(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["message"]["content"]
    return text


def test_rule_answers_within_the_options_and_calls_are_recorded(standin: StandinHandle) -> None:
    standin.clear()
    url = f"{standin.api_base}/chat/completions"
    with httpx.Client() as client:
        assert json.loads(content(client.post(url, json=enum_body(["a", "bb"], "I say bb")))) == \
            {"answer": "bb"}
        assert json.loads(content(client.post(url, json=enum_body(["x", "y"], "none", shape="s")))) \
            == "x"
        multi = enum_body(["x"], "no way")
        multi["response_format"]["json_schema"]["schema"]["properties"]["second"] = {
            "type": "string", "enum": ["yes", "no"]}
        assert json.loads(content(client.post(url, json=multi))) == {"answer": "x", "second": "no"}
        plain = {"model": "standin", "messages": [{"role": "user", "content": "hello"}]}
        assert content(client.post(url, json=plain)) == "echo: hello"
        calls = client.get(f"{standin.url}/calls").json()
        assert len(calls) == 4 and calls[3]["body"] == plain and calls[0]["mode"] == "ok"
        assert client.delete(f"{standin.url}/calls").json() == {"cleared": 4}
        assert client.get(f"{standin.url}/calls").json() == []


def test_fault_switches(standin: StandinHandle) -> None:
    url = f"{standin.api_base}/chat/completions"
    body = enum_body(["a", "b"], "b")
    with httpx.Client(timeout=5) as client:
        control = f"{standin.url}/control"
        assert client.post(control, json={"mode": "nonsense"}).status_code == 400
        client.post(control, json={"mode": "fail500", "times": 2})
        assert [client.post(url, json=body).status_code for _ in range(3)] == [500, 500, 200]
        client.post(control, json={"mode": "ratelimit", "times": 1, "retry_after_s": 4})
        limited = client.post(url, json=body)
        assert limited.status_code == 429 and limited.headers["retry-after"] == "4"
        client.post(control, json={"mode": "wrong_option", "times": 1})
        assert json.loads(content(client.post(url, json=body))) == {"answer": "not-an-option"}
        client.post(control, json={"mode": "malformed", "times": 1})
        with pytest.raises(ValueError):
            json.loads(content(client.post(url, json=body)))
        client.post(control, json={"mode": "stall", "times": 1, "stall_s": 0.5})
        start = time.monotonic()
        assert json.loads(content(client.post(url, json=body))) == {"answer": "b"}
        assert time.monotonic() - start >= 0.45
        assert client.get(control).json() == {"mode": "ok", "times": None}


def test_stream_sends_several_sse_chunks(standin: StandinHandle) -> None:
    body = {"model": "standin", "stream": True,
            "messages": [{"role": "user", "content": "a longer message to split"}]}
    with httpx.Client() as client:
        raw = client.post(f"{standin.api_base}/chat/completions", json=body).text
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) >= 5
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        "echo: a longer message to split"


def test_model_choice_is_restricted_to_the_options(tmp_path: Path) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    texts = ["card lost", "lost my card", "card stolen", "when does my card arrive",
             "card arrival time", "card not arrived", "exchange rate", "rate for euros",
             "currency exchange rate"]
    labels = ["lost"] * 3 + ["arrival"] * 3 + ["rate"] * 3
    pipeline = make_pipeline(TfidfVectorizer(), LogisticRegression(random_state=0)).fit(texts, labels)
    path = tmp_path / "m.joblib"
    joblib.dump({"pipeline": pipeline}, path)
    handle = start_standin(model_path=path)
    try:
        url = f"{handle.api_base}/chat/completions"
        with httpx.Client() as client:
            def ask(options: list[str], text: str) -> str:
                answer: str = json.loads(content(client.post(url, json=enum_body(options, text))))[
                    "answer"]
                return answer

            assert ask(["lost", "arrival", "rate"], "I lost my card") == "lost"
            assert ask(["arrival", "rate"], "I lost my card") in {"arrival", "rate"}
            assert ask(["rate", "lost"], "exchange rate please") == "rate"
            assert ask(["x", "y"], "y is it") == "y"  # no known option: the rule decides
    finally:
        handle.stop()


def test_rule_prefers_the_longest_named_option() -> None:
    assert rule_chooser("my card_arrival is late", ["card", "card_arrival"]) == "card_arrival"
    assert rule_chooser("nothing here", ["b", "a"]) == "b"


def test_runs_on_its_own_as_a_script() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "standins/llm.py", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert models.json()["data"][0]["id"] == "standin"
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                           json=enum_body(["yes", "no"], "no thanks"))
        assert json.loads(content(reply)) == {"answer": "no"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
