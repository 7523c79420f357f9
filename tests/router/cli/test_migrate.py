"""``slotgate migrate`` on a model and policy written by earlier slotgates' own CLI (train and
tune on 300 BANKING77 rows of five intents, tests/fixtures/upgrade/README.md): one from before
questions were recorded (refused by the router: its text model was fingerprinted by file bytes,
and its question is unrecorded) and two from d9108b0 (one served as it is, one whose multi-line
``--context`` was hashed as written). Migrated, each is loaded and decides its own question."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from policies.file import PolicyFileError, load_policy
from policies.types import DecisionRequest, Option
from router.backends.sklearn import SklearnBackend, load_text_model
from router.cli.app import app
from router.errors import ConfigError
from router.http.openai.questions import split_conversation
from router.routing.registry import PolicyRegistry
from router.settings import PolicySettings

FIXTURES = Path(__file__).parents[2] / "fixtures" / "upgrade"
OLD, D9108B0 = FIXTURES / "before-questions", FIXTURES / "d9108b0"
INTENTS = ("card_arrival", "exchange_rate", "lost_or_stolen_card", "pin_blocked", "top_up_failed")
CONTEXT = "You sort banking messages.\nAnswer with the intent."


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, ["migrate", *(str(a) for a in args)])


def copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(source, tmp_path / f"{source.parent.name}-{source.name}"))


def registry(path: Path, model: Path) -> PolicyRegistry:
    fingerprint = SklearnBackend(model=load_text_model(model)).fingerprint
    return PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=fingerprint)


def intent(*, system: tuple[str, ...] = (), options: tuple[str, ...] = INTENTS) -> DecisionRequest:
    turns = tuple(("system", text) for text in system) + (("user", "my card is not here"),)
    context, state = split_conversation(turns)
    return DecisionRequest("intent", "intent", tuple(Option(o) for o in options), state,
                           context=context)


def test_a_policy_from_before_questions_is_refused_then_migrated_and_served(
        tmp_path: Path) -> None:
    policy = copy(OLD / "policy.json", tmp_path)
    with pytest.raises(ConfigError, match="backend fingerprint"):
        registry(policy, OLD / "model.joblib")
    unnamed = invoke("--policy", policy, "--model", OLD / "model.joblib")
    assert unnamed.exit_code == 2 and "--question" in unnamed.stderr
    result = invoke("--policy", policy, "--model", OLD / "model.joblib", "--question", "intent")
    assert result.exit_code == 0, result.output
    assert "backend fingerprint" in result.stdout and "question 'intent'" in result.stdout
    served = registry(policy, OLD / "model.joblib")
    [loaded] = served.loaded()
    assert served.lookup(intent(), fingerprint=loaded.file.backend_fingerprint) is loaded.runtime
    # Any order of the options; not another question over them.
    reversed_options = intent(options=INTENTS[::-1])
    assert served.lookup(reversed_options, fingerprint=loaded.file.backend_fingerprint) \
        is loaded.runtime
    other = DecisionRequest("not_intent", "not_intent", intent().options, "x")
    assert served.lookup(other, fingerprint=loaded.file.backend_fingerprint) is None


def test_migrate_refuses_a_model_the_policy_was_not_tuned_on(tmp_path: Path) -> None:
    """The d9108b0 model computes what the old one did (same rows, same seed), but nothing in
    the old policy shows it was tuned on that file: refused, and the file is left alone."""
    policy = copy(OLD / "policy.json", tmp_path)
    before = policy.read_bytes()
    result = invoke("--policy", policy, "--model", D9108B0 / "model.joblib", "--question",
                    "intent")
    assert result.exit_code == 2 and "tuned on another model" in result.stderr
    assert policy.read_bytes() == before


def test_a_policy_from_d9108b0_is_served_as_it_is(tmp_path: Path) -> None:
    policy = copy(D9108B0 / "policy.json", tmp_path)
    served = registry(policy, D9108B0 / "model.joblib")
    [loaded] = served.loaded()
    assert served.lookup(intent(), fingerprint=loaded.file.backend_fingerprint) is loaded.runtime
    result = invoke("--policy", policy, "--model", D9108B0 / "model.joblib")
    assert result.exit_code == 0 and "nothing to migrate" in result.stdout


def test_a_context_hashed_as_written_is_refused_naming_migrate_then_re_signed(
        tmp_path: Path) -> None:
    policy = copy(D9108B0 / "policy-ctx.json", tmp_path)
    with pytest.raises(PolicyFileError, match="slotgate migrate --policy"):
        load_policy(policy)
    result = invoke("--policy", policy)
    assert result.exit_code == 0 and "hashed as written" in result.stdout, result.output
    migrated = load_policy(policy)
    assert migrated.question is not None and migrated.question.context == " ".join(
        CONTEXT.split())
    served = registry(policy, D9108B0 / "model.joblib")
    [loaded] = served.loaded()
    fingerprint = loaded.file.backend_fingerprint
    for system in [(CONTEXT,), (CONTEXT + "\n",), (CONTEXT.replace("\n", "\r\n"),),
                   (CONTEXT.replace(" ", "  "),), (f"  {CONTEXT} ",),
                   tuple(CONTEXT.split("\n"))]:
        assert served.lookup(intent(system=system), fingerprint=fingerprint) is loaded.runtime, \
            system
    assert served.lookup(intent(system=("You sort banking messages.",)),
                         fingerprint=fingerprint) is None


def test_a_hand_edited_question_is_not_re_signed(tmp_path: Path) -> None:
    policy = copy(D9108B0 / "policy-ctx.json", tmp_path)
    data = json.loads(policy.read_text(encoding="utf-8"))
    data["question"]["context"] = "You sort banking messages. Answer with any intent but one."
    policy.write_text(json.dumps(data), encoding="utf-8")
    result = invoke("--policy", policy)
    assert result.exit_code == 2 and "field 'signature'" in result.stderr
    assert "re-tune" in result.stderr


def test_a_policy_tuned_with_context_on_logged_rows_covers_any_option_order(
        tmp_path: Path) -> None:
    """Rows exported from the decision log carry the logged order (yes, no, maybe) and that
    request's signature; tuned naming the question and its context, the policy's scope is the
    question over the option set, so every order and layout of that context is covered."""
    from tests.router.cli.test_tune_command import OPTIONS, synthetic_rows, write_jsonl

    preds = write_jsonl(tmp_path / "logged.jsonl",
                        synthetic_rows(1200, signature="a" * 64, fingerprint="fp"))
    out = tmp_path / "policy.json"
    result = CliRunner().invoke(app, ["tune", "--preds", str(preds), "--target-accuracy", "0.8",
                                      "--question", "answer", "--context", CONTEXT,
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    served = PolicyRegistry.load(PolicySettings(files=[out]), backend_fingerprint="fp")
    [loaded] = served.loaded()
    for options in (OPTIONS, OPTIONS[::-1], sorted(OPTIONS)):
        for system in ((CONTEXT,), (CONTEXT.replace("\n", "\r\n") + "\n",),
                       tuple(CONTEXT.split("\n"))):
            turns = tuple(("system", text) for text in system) + (("user", "hm"),)
            context, state = split_conversation(turns)
            asked = DecisionRequest("answer", "answer", tuple(Option(o) for o in options), state,
                                    context=context)
            assert served.lookup(asked, fingerprint="fp") is loaded.runtime, (options, system)


def test_a_policy_of_one_logged_option_order_is_migrated_to_its_question(
        tmp_path: Path) -> None:
    """Tuned on rows exported from the decision log with no question named, a policy answers
    that one logged request's signature: its options in the logged order only. Naming the
    question that signature hashes (checked) scopes it to the question over the option set."""
    from tests.router.cli.test_tune_command import OPTIONS, synthetic_rows, write_jsonl

    def asked(options: list[str]) -> DecisionRequest:
        context, state = split_conversation((("system", CONTEXT), ("user", "hm")))
        return DecisionRequest("answer", "answer", tuple(Option(o) for o in options), state,
                               context=context)

    logged = asked(OPTIONS).signature()
    preds = write_jsonl(tmp_path / "logged.jsonl",
                        synthetic_rows(1200, signature=logged, fingerprint="fp"))
    policy = tmp_path / "policy.json"
    tuned = CliRunner().invoke(app, ["tune", "--preds", str(preds), "--target-accuracy", "0.8",
                                     "--out", str(policy)])
    assert tuned.exit_code == 0, tuned.output

    def covers(options: list[str]) -> bool:
        served = PolicyRegistry.load(PolicySettings(files=[policy]), backend_fingerprint="fp")
        return served.lookup(asked(options), fingerprint="fp") is not None

    assert covers(OPTIONS) and not covers(OPTIONS[::-1])
    wrong = invoke("--policy", policy, "--question", "answer", "--context", "Another prompt.")
    assert wrong.exit_code == 2 and "logged order" in wrong.stderr
    result = invoke("--policy", policy, "--question", "answer", "--context", CONTEXT)
    assert result.exit_code == 0 and "one logged option order" in result.stdout, result.output
    assert covers(OPTIONS) and covers(OPTIONS[::-1]) and covers(sorted(OPTIONS))
    assert load_policy(policy).digest is not None  # sealed again over what migrate changed


def test_a_sealed_file_edited_since_tuning_is_not_migrated(tmp_path: Path) -> None:
    from tests.router.cli.test_tune_command import synthetic_rows, write_jsonl

    preds = write_jsonl(tmp_path / "p.jsonl",
                        synthetic_rows(1200, signature="b" * 64, fingerprint="fp"))
    policy = tmp_path / "policy.json"
    tuned = CliRunner().invoke(app, ["tune", "--preds", str(preds), "--target-accuracy", "0.8",
                                     "--out", str(policy)])
    assert tuned.exit_code == 0, tuned.output
    data = json.loads(policy.read_text(encoding="utf-8"))
    data["bound"] = 0.999
    policy.write_text(json.dumps(data), encoding="utf-8")
    result = invoke("--policy", policy, "--question", "answer")
    assert result.exit_code == 2 and "field 'digest'" in result.stderr
