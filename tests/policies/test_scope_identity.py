"""The canonical question identity (policies/scope.py): what is normalised (whitespace, line
endings, a text that only spells the id, a repeated part) and what is not (any word), and the
near-miss finder's one-field rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.scope import (
    Question,
    QuestionScope,
    canonical_text,
    near_miss,
    question_text,
    scope_signature,
)
from policies.types import DecisionRequest, Option

OPTIONS = ("card_arrival", "exchange_rate", "pin_blocked")


def test_canonical_text_is_words_separated_by_one_space() -> None:
    assert canonical_text("  A\r\nB\rC\n\nD\t E  ") == "A B C D E"
    assert canonical_text("") == ""


@given(st.lists(st.text(alphabet="ab ", min_size=1), min_size=1, max_size=4),
       st.sampled_from([" ", "\n", "\r\n", "\r", "\t", "  \n  "]))
def test_any_whitespace_between_the_same_words_is_the_same_question(
        words: list[str], separator: str) -> None:
    text = separator.join(words)
    assert Question.asked("q", context=text) == Question.asked("q", context=" ".join(words))


def test_any_word_changed_is_another_question() -> None:
    base = Question.asked("intent", instructions="Which intent?", context="Banking.")
    for other in (Question.asked("intent", instructions="Which intent not?", context="Banking."),
                  Question.asked("intent", instructions="Which intent?", context="Banking!"),
                  Question.asked("intents", instructions="Which intent?", context="Banking."),
                  Question.asked("intent", instructions="which intent?", context="Banking.")):
        assert scope_signature(OPTIONS, other) != scope_signature(OPTIONS, base)


def test_question_text_drops_parts_that_only_spell_the_id_or_repeat() -> None:
    assert question_text("customer_intent", ["Customer Intent", "customer-intent", None, ""]) == ""
    assert question_text("intent", ["Reply", "reply", "Intent", "Which one?"]) == (
        "Reply\nWhich one?")
    # Every kept part is kept whole, outermost first.
    assert question_text("intent", ["Which intent does the message NOT express?", "intent"]) == (
        "Which intent does the message NOT express?")


def request(*, instructions: str = "intent", context: str = "",
            options: tuple[str, ...] = OPTIONS, question_id: str = "intent") -> DecisionRequest:
    return DecisionRequest(question_id, instructions, tuple(Option(o) for o in options), "s",
                           context=context)


def test_near_miss_names_the_one_field_that_differs() -> None:
    tuned = {"intent@1": QuestionScope(Question.asked("intent", context="Banking."),
                               frozenset(OPTIONS))}
    assert near_miss(QuestionScope.of(request(context="Banking.")), tuned) is None  # covered
    assert near_miss(QuestionScope.of(request(context=" Banking.\n")), tuned) is None  # the same
    policy, field, detail = near_miss(QuestionScope.of(request(context="Travel.")), tuned) or ("", "", "")
    assert (policy, field) == ("intent@1", "context") and "'Travel.'" in detail
    _, field, detail = near_miss(QuestionScope.of(request(context="Banking.", options=OPTIONS[:2])),
                                 tuned) or ("", "", "")
    assert field == "options" and "pin_blocked" in detail
    _, field, _ = near_miss(QuestionScope.of(request(context="Banking.", question_id="q",
                                             instructions="q")), tuned) or ("", "", "")
    assert field == "id"
    # Two fields away: not a near miss.
    assert near_miss(QuestionScope.of(request(context="Travel.", options=OPTIONS[:2])), tuned) is None
