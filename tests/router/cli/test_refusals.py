"""The CLI as a new user meets it, start-up checks included: non-UTF-8 files, a --report that
cannot be made, a policy of another model or question, `serve` with a missing or truncated
artifact or a bad setting, `export-log` reading ./slotgate.yaml, and
environment errors named as such. Every refusal is exit 2, one message, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from router.cli.app import app

OPTIONS = ["card_arrival", "card_lost", "exchange_rate"]


def invoke(*args: object, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def write_preds(path: Path, *, options: list[str] = OPTIONS, fingerprint: str = "fp-a",
                n: int = 400) -> Path:
    k = len(options)
    rows = [{"id": str(i), "options": options,
             "proba": [0.7] + [0.3 / (k - 1)] * (k - 1), "label": options[i % 2],
             "fingerprint": fingerprint} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_message(result: Any) -> str:
    """The refusal: exit 2 and a single 'error:' line, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


# ---- non-UTF-8 input -------------------------------------------------------------------------

def test_a_latin1_csv_is_exit_2_naming_the_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "latin1.csv"
    data.write_bytes("text,category\nmy card,card_lost\ncaf\u00e9 card,card_lost\n".encode("latin-1"))
    out = tmp_path / "m.joblib"
    message = one_message(invoke("train", "--question", "intent",
                                 "--data", data, "--label-column", "category",
                                 "--out", out))
    assert f"{data}: line 3: not UTF-8" in message and "0xe9" in message
    assert not out.exists()


def test_a_latin1_jsonl_is_exit_2_naming_the_file_and_line(tmp_path: Path) -> None:
    preds = write_preds(tmp_path / "p.jsonl")
    with preds.open("ab") as f:
        f.write(b'{"id": "x\xff", "options": [], "proba": [], "label": null}\n')
    out = tmp_path / "policy.json"
    message = one_message(invoke("tune", "--question", "intent", "--preds", preds, "--out", out))
    assert f"{preds}: line 401: not UTF-8" in message and not out.exists()


# ---- tune / eval ----------------------------------------------------------------------------

def test_tune_checks_report_before_writing_the_policy(tmp_path: Path) -> None:
    preds = write_preds(tmp_path / "p.jsonl")
    (tmp_path / "notadir").write_text("a file")
    out = tmp_path / "policy.json"
    message = one_message(invoke("tune", "--question", "intent", "--preds", preds, "--out", out,
                                 "--report", tmp_path / "notadir" / "sub"))
    assert "--report" in message and "notadir is not a folder" in message
    assert not out.exists()


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    out = tmp_path / "policy.json"
    result = invoke("tune", "--question", "intent",
                    "--preds", write_preds(tmp_path / "tune.jsonl"), "--out", out)
    assert result.exit_code == 0, result.stderr
    assert json.loads(out.read_text())["options"] == OPTIONS
    return out


def test_eval_refuses_another_models_policy_unless_told(tmp_path: Path, policy: Path) -> None:
    other = write_preds(tmp_path / "other.jsonl", fingerprint="fp-b")
    message = one_message(invoke("eval", "--preds", other, "--policy", policy, "--json"))
    assert "fp-b" in message and "fp-a" in message and "--allow-mismatch" in message
    allowed = invoke("eval", "--preds", other, "--policy", policy, "--json", "--allow-mismatch")
    assert allowed.exit_code == 0 and "warning:" in allowed.stderr
    assert json.loads(allowed.stdout)["n"] == 400


def test_eval_refuses_a_policy_tuned_on_other_options(tmp_path: Path) -> None:
    many = [f"intent_{i}" for i in range(77)]
    policy = tmp_path / "p77.json"
    assert invoke("tune", "--question", "intent",
                  "--preds", write_preds(tmp_path / "t77.jsonl", options=many),
                  "--out", policy).exit_code == 0
    few = write_preds(tmp_path / "three.jsonl")  # same fingerprint, 3 options
    message = one_message(invoke("eval", "--preds", few, "--policy", policy))
    assert "(3)" in message and "(77)" in message


# ---- serve: everything a decision needs, checked before uvicorn starts ----------------------

@pytest.fixture
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("model")
    lines = ["text,category"] + [f"{word} {i},{label}" for label, word in
                                 (("card_lost", "lost card"), ("card_arrival", "card arrived"))
                                 for i in range(10)]
    data = work / "toy.csv"
    data.write_text("\n".join(lines) + "\n")
    out = work / "toy.joblib"
    assert invoke("train", "--question", "intent",
                  "--data", data, "--label-column", "category", "--out", out).exit_code == 0
    return out


def serve_config(tmp_path: Path, model: Path, **overrides: Any) -> Path:
    config: dict[str, Any] = {
        "port": 1, "fast": {"kind": "sklearn", "model_path": str(model)},
        "log": {"decision_log_path": str(tmp_path / "var" / "decisions.jsonl")}}
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    path = tmp_path / "serve.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def test_serve_with_a_missing_model_names_it(tmp_path: Path, model: Path) -> None:
    missing = tmp_path / "gone.joblib"
    message = one_message(invoke("serve", "--config", serve_config(tmp_path, missing)))
    assert str(missing) in message and "not found" in message


def test_serve_with_a_truncated_model_names_it(tmp_path: Path, model: Path) -> None:
    cut = tmp_path / "cut.joblib"
    cut.write_bytes(model.read_bytes()[:300])
    message = one_message(invoke("serve", "--config", serve_config(tmp_path, cut)))
    assert str(cut) in message


def test_serve_with_a_truncated_policy_names_it(tmp_path: Path, model: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text('{"format": "slotgate/policy", "name": ')
    config = serve_config(tmp_path, model, policy={"files": [str(policy)]})
    message = one_message(invoke("serve", "--config", config))
    assert str(policy) in message


def test_serve_with_an_unwritable_decision_log_names_the_setting(tmp_path: Path,
                                                                 model: Path) -> None:
    (tmp_path / "blocker").write_text("a file where a folder should be")
    config = serve_config(tmp_path, model,
                          log={"decision_log_path": str(tmp_path / "blocker" / "d.jsonl")})
    message = one_message(invoke("serve", "--config", config))
    assert "log.decision_log_path" in message and "blocker" in message


def test_serve_with_a_bad_namespace_names_the_setting(tmp_path: Path, model: Path) -> None:
    config = serve_config(tmp_path, model, cache={"namespace": "prod:eu"})
    message = one_message(invoke("serve", "--config", config))
    assert "cache.namespace" in message and "prod:eu" in message and str(config) in message


def test_environment_errors_are_named_as_environment_errors(tmp_path: Path, model: Path) -> None:
    config = serve_config(tmp_path, model)
    message = one_message(invoke("serve", "--config", config,
                                 env={"SLOTGATE_CACHE__NAMESPACE": "prod:eu"}))
    assert "environment variable SLOTGATE_CACHE__NAMESPACE" in message
    assert "--config" not in message
    message = one_message(invoke("export-log", "--out", tmp_path / "x.jsonl",
                                 env={"SLOTGATE_SLOW__TIMEOUT_S": "soon"}))
    assert "environment variable SLOTGATE_SLOW__TIMEOUT_S" in message and "slow.timeout_s" in message


def test_export_log_without_config_reads_slotgate_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "logs" / "here.jsonl"
    log.parent.mkdir()
    record = {"decision_id": "d1", "time": 1.0, "namespace": "default", "question_id": "q",
              "signature": "s", "fingerprint": "fp", "options": ["a", "b"], "proba": [0.9, 0.1],
              "text": "t", "answer": "a", "route": "fast"}
    log.write_text(json.dumps(record) + "\n")
    (tmp_path / "slotgate.yaml").write_text(f"log:\n  decision_log_path: {log}\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("export-log", "--out", tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    assert str(log) in result.stdout and (tmp_path / "out.jsonl").read_text().count("\n") == 1
