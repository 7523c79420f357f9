"""The vllm backend against the vLLM stand-in (vLLM's diffusion-field validation in front of a
real BANKING77 model), with SmolLM2's byte-level BPE tokenizer (labels take another id after
"id: " than alone, as with DiffusionGemma's): the request the engine accepts, the one-step read,
the example server's prompt and label ids, the slot parse, draws, the label cap."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.types import Option
from router.backends.example_template import TEMPLATE_VERSION
from router.backends.options import VllmOptions
from router.backends.vllm import MISSING_LABEL_PENALTY, VllmBackend, slot_distribution
from router.errors import BackendRejected, BackendUnavailable, ConfigError, UnprocessableRequest
from router.settings import FastBackendSettings
from standins.harness import Reply
from standins.vllm_server import LABEL_MASS, VllmStandin
from tests.conftest import free_port
from tests.router.backends.standins import (
    BPE_TOKENIZER_DIR,
    STATE,
    bpe_tokenizer,
    intent_names,
    intent_request,
    small_reader,
)

FOUR = ["card_arrival", "exchange_rate", "pin_blocked", "age_limit"]


def make_backend(url: str, *, max_concurrency: int = 16, **options: Any) -> VllmBackend:
    return VllmBackend(url, VllmOptions(**options), tokenizer=bpe_tokenizer(),
                       max_concurrency=max_concurrency)


def slot_ids(question_id: str, labels: list[str]) -> list[int]:
    """What the example server reads: each label's id as the last token of "{id}: {label}"."""
    return [bpe_tokenizer().encode(f"{question_id}: {label}", add_special_tokens=False)[-1]
            for label in labels]


@pytest.fixture
def standin(banking77_dir: Path) -> Iterator[VllmStandin]:
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=bpe_tokenizer()) as server:
        yield server


@pytest.fixture
async def backend(standin: VllmStandin) -> AsyncIterator[VllmBackend]:
    b = make_backend(standin.url)
    yield b
    await b.aclose()


def test_choice_labels_are_the_servers_then_slotgates_lift() -> None:
    backend = make_backend("http://x")
    assert backend.alphabet[:26] == tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert len(backend.alphabet) == 128
    with pytest.raises(ConfigError, match="labels: .*not a single token"):
        make_backend("http://127.0.0.1:1", labels=["A", "zqxjv"])


async def test_request_is_one_the_engine_accepts(standin: VllmStandin, backend: VllmBackend) -> None:
    request = intent_request(FOUR, seed=11)
    [scores] = await backend.read([request])
    body = standin.stats.bodies[0]
    xargs = body["vllm_xargs"]
    canvas = xargs["diffusion_seed_canvas"]
    template = backend.template("intent", ("A", "B", "C", "D"))
    assert len(canvas) == xargs["diffusion_canvas_length"] == backend.canvas_width(template)
    assert len(canvas) % 16 == 0 and all(0 <= t < 262_144 for t in canvas)
    assert canvas[template.slot + 1] == 106  # turn close
    assert xargs["diffusion_read_only"] is True
    assert body["max_tokens"] == template.slot + 2
    assert body["logprob_token_ids"] == sorted(slot_ids("intent", ["A", "B", "C", "D"]))
    assert body["logprobs"] is True and body["return_tokens_as_token_ids"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert scores.options == tuple(FOUR) and scores.top[0] == "card_arrival"
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)


async def test_one_step_read_is_what_vllm_calls_one(
    standin: VllmStandin, backend: VllmBackend, banking77_dir: Path
) -> None:
    """vLLM reads one step only with read_only AND diffusion_max_steps == 1; the stand-in, like
    the engine, reports a converged (sharper) canvas otherwise, so the probabilities would differ."""
    [scores] = await backend.read([intent_request(FOUR)])
    xargs = standin.stats.bodies[-1]["vllm_xargs"]
    assert xargs["diffusion_max_steps"] == 1 and "diffusion_pinned" not in xargs
    one_step = small_reader(banking77_dir).proba(STATE, [(n, None) for n in FOUR])
    assert scores.proba == pytest.approx(one_step, abs=1e-9)
    body = valid_body(backend)
    del body["vllm_xargs"]["diffusion_max_steps"]
    async with httpx.AsyncClient() as client:
        converged = (await client.post(f"{standin.url}/v1/chat/completions", json=body)).json()
    template = backend.template("intent", ("A", "B", "C", "D"))
    proba, _ = slot_distribution(converged["choices"][0], template.slot, template.label_ids)
    assert max(proba) > max(one_step) + 0.01  # a silent difference: what the two flags guard
    two = make_backend(standin.url, steps=2)
    await two.read([intent_request(FOUR)])
    xargs = standin.stats.bodies[-1]["vllm_xargs"]
    assert xargs["diffusion_max_steps"] == 2  # past one step the server pins the template
    assert xargs["diffusion_pinned"] == [i for i in range(len(xargs["diffusion_seed_canvas"]))
                                         if i != template.slot]
    await two.aclose()


async def test_label_ids_are_taken_at_the_answer_slot(
    standin: VllmStandin, backend: VllmBackend
) -> None:
    """"bucket: A" ends in the id of " A" with a BPE tokenizer: the server reads that id, and so
    must the backend (the id of "A" alone is one the model barely predicts there)."""
    tok = bpe_tokenizer()
    request = intent_request(FOUR[:3], question_id="bucket")
    [scores] = await backend.read([request])
    body = standin.stats.bodies[-1]
    assert body["logprob_token_ids"] == sorted(slot_ids("bucket", ["A", "B", "C"]))
    assert body["logprob_token_ids"] != sorted(tok.encode(x, add_special_tokens=False)[0]
                                               for x in "ABC")
    assert scores.raw["label_mass"][0] == pytest.approx(LABEL_MASS, rel=1e-6)
    assert scores.top[0] == "card_arrival"


def test_prompt_is_the_example_servers(backend: VllmBackend) -> None:
    request = dataclasses.replace(
        intent_request(FOUR[:2], question_id="bucket"), context="Bank support.",
        options=(Option("card_arrival", "card not here"), Option("exchange_rate")))
    body = backend.build_body(request, draw=0)
    assert body["messages"][0]["content"] == (
        "Answer a fixed set of questions about the state the user provides. Each question lists "
        "its allowed answers; reply with exactly one label per question.\n"
        "\nBank support.\n"
        "\nQuestion bucket: Which banking intent does the message express?\n"
        "  A: card_arrival (card not here)\n"
        "  B: exchange_rate\n"
        '\nReply with one line per question, in this order, formatted as "id: label".')
    noul = dataclasses.replace(request, kind="noul", context="",
                               options=(Option("no"), Option("yes", "it is urgent")))
    text = backend.build_body(noul, draw=0)["messages"][0]["content"]
    assert "  yes: it is urgent\n  no\n" in text  # yes first, criteria as descriptions
    score = dataclasses.replace(request, kind="score", options=tuple(Option(x) for x in "abc"))
    assert "  1: a\n  2: b\n  3: c\n" in backend.build_body(score, draw=0)["messages"][0]["content"]
    assert backend.identity()["template"] == TEMPLATE_VERSION
    # the question id is prompt text: it is in the read key
    other = dataclasses.replace(request, question_id="urgent")
    assert backend.read_inputs(request, [request]) != backend.read_inputs(other, [other])


def test_a_template_past_the_canvas_is_the_callers_error(backend: VllmBackend) -> None:
    request = intent_request(FOUR, question_id="x" * 300)
    with pytest.raises(UnprocessableRequest, match="answer template is .* tokens; the canvas holds 63"):
        backend.build_body(request, draw=0)


def test_noise_is_drawn_below_the_engines_vocabulary(backend: VllmBackend) -> None:
    import random

    template = backend.template("intent", ("A", "B"))
    canvas = backend.seed_canvas(template, 123)
    assert canvas[template.slot] == random.Random(123).randrange(262_144)
    assert len(bpe_tokenizer()) < 262_144


async def test_static_prompt_first_state_last(standin: VllmStandin, backend: VllmBackend) -> None:
    await backend.read([intent_request(FOUR, state="where is my card"),
                        intent_request(FOUR, state="what is the exchange rate")])
    first, second = (b["messages"] for b in standin.stats.bodies)
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[0] == second[0]  # identical static prefix: vLLM's prefix cache reuses it
    assert {first[1]["content"], second[1]["content"]} == {"where is my card",
                                                           "what is the exchange rate"}
    assert "where is my card" not in first[0]["content"]
    for label, name in zip(backend.alphabet, FOUR):
        assert f"\n  {label}: {name}" in first[0]["content"]


def test_missing_label_gets_lowest_minus_five() -> None:
    choice = {"logprobs": {"content": [
        {"token": "token_id:5", "logprob": 0.0, "top_logprobs": []},
        {"token": "token_id:7", "logprob": -0.1, "top_logprobs": [
            {"token": "token_id:7", "logprob": -0.1}, {"token": "token_id:9", "logprob": -2.0},
            {"token": "token_id:3", "logprob": -4.0}]},
    ]}}
    proba, diagnostics = slot_distribution(choice, 1, [7, 3, 42])
    floor = -4.0 - MISSING_LABEL_PENALTY
    expected = [math.exp(x) for x in (-0.1, -4.0, floor)]
    assert proba == pytest.approx([e / sum(expected) for e in expected])
    assert diagnostics["label_mass"] == pytest.approx(math.exp(-0.1) + math.exp(-4.0))


async def test_draws_as_parallel_reads_or_one_server_sampled_read(standin: VllmStandin) -> None:
    parallel = make_backend(standin.url)
    [scores] = await parallel.read([intent_request(FOUR, samples=3, seed=5)])
    canvases = [b["vllm_xargs"]["diffusion_seed_canvas"] for b in standin.stats.bodies]
    assert len(canvases) == 3 and scores.raw["draws"] == 3
    template = parallel.template("intent", ("A", "B", "C", "D"))
    slot = template.slot
    # the draws arrive in any order: compare as a set of canvases
    assert sorted(canvases) == sorted(parallel.seed_canvas(template, 5 + 7919 * j) for j in range(3))
    assert len({c[slot] for c in canvases}) == 3
    assert all(c[:slot] == canvases[0][:slot] for c in canvases)  # noise only at the slot
    sampled = make_backend(standin.url, server_samples=True, constrained=True)
    [scores] = await sampled.read([intent_request(FOUR, samples=3)])
    xargs = standin.stats.bodies[-1]["vllm_xargs"]
    assert standin.stats.requests == 4 and scores.raw["draws"] == 3
    assert xargs["diffusion_samples"] == 3 and xargs["diffusion_constrained"] is True
    assert xargs["diffusion_pinned"] == [i for i in range(len(canvases[0])) if i != slot]
    for b in (parallel, sampled):
        await b.aclose()


async def test_an_engine_without_diffusion_samples_gets_client_side_draws(
    banking77_dir: Path,
) -> None:
    """An older vLLM ignores diffusion_samples and returns one draw: the backend sees it and
    reads the missing draws itself, then stops asking the engine for them."""
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=bpe_tokenizer(),
                     engine_samples=False) as old:
        b = make_backend(old.url, server_samples=True)
        [scores] = await b.read([intent_request(FOUR, samples=3, seed=5)])
        assert scores.raw["draws"] == 3 and old.stats.requests == 3
        seeds = sorted(body["vllm_xargs"]["diffusion_seed_canvas"] for body in old.stats.bodies)
        template = b.template("intent", ("A", "B", "C", "D"))
        assert seeds == sorted(b.seed_canvas(template, 5 + 7919 * j) for j in range(3))
        await b.read([intent_request(FOUR, samples=3, seed=6)])
        assert old.stats.requests == 6
        assert all("diffusion_samples" not in body["vllm_xargs"] for body in old.stats.bodies[3:])
        await b.aclose()


@pytest.mark.parametrize(("n_extra", "cap", "calls"), [(0, 30, 4), (73, 128, 3)])
async def test_label_cap_falls_back_to_the_grouped_read(
    standin: VllmStandin, banking77_dir: Path, n_extra: int, cap: int, calls: int
) -> None:
    names = intent_names(banking77_dir) + [f"other_topic_{i}" for i in range(n_extra)]
    b = make_backend(standin.url, label_cap=cap)
    [scores] = await b.read([intent_request(names)])
    assert standin.stats.requests == calls
    assert all(len(body["logprob_token_ids"]) <= cap for body in standin.stats.bodies)
    assert scores.options == tuple(names) and min(scores.proba) > 0
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    assert scores.top[0] == "card_arrival"
    await b.aclose()


def valid_body(backend: VllmBackend) -> dict[str, Any]:
    return backend.build_body(intent_request(FOUR), draw=0)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b["vllm_xargs"]["diffusion_seed_canvas"].pop(), "must hold exactly 16 ids, got 15"),
        (lambda b: b["vllm_xargs"]["diffusion_seed_canvas"].__setitem__(0, 10**7), "ids must be in"),
        (lambda b: b["vllm_xargs"].__setitem__("diffusion_canvas_length", 128),
         "no larger than the served canvas"),
        (lambda b: b["vllm_xargs"].__setitem__("diffusion_max_steps", 0),
         "diffusion_max_steps must be a positive integer"),
        (lambda b: b["vllm_xargs"].__setitem__("diffusion_read_only", 2),
         "diffusion_read_only must be a boolean"),
        (lambda b: b.__setitem__("logprob_token_ids", list(range(129))), "at most 128"),
        (lambda b: b["vllm_xargs"].update(diffusion_pinned=[0], diffusion_seed_canvas=None),
         "diffusion_pinned needs a diffusion_seed_canvas"),
        (lambda b: b["vllm_xargs"].update(diffusion_pinned=[99]), "must lie inside the canvas"),
        (lambda b: b.update(logprob_token_ids=None, vllm_xargs={**b["vllm_xargs"],
                                                                 "diffusion_constrained": True}),
         "diffusion_constrained needs logprob_token_ids"),
        (lambda b: b["vllm_xargs"].update(diffusion_samples=2), "needs a diffusion_seed_canvas and"),
        (lambda b: b.__setitem__("top_logprobs", 50), "max_logprobs"),
    ],
)
async def test_standin_rejects_what_vllm_rejects(
    standin: VllmStandin, backend: VllmBackend, mutate: Any, message: str
) -> None:
    body = valid_body(backend)
    mutate(body)
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{standin.url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


async def test_engine_rejections_and_outages_map_to_the_error_tree(
    banking77_dir: Path, standin: VllmStandin
) -> None:
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=bpe_tokenizer(),
                     canvas_length=8) as narrow:
        b = make_backend(narrow.url)
        with pytest.raises(BackendRejected, match=r"no larger than the served canvas"):
            await b.read([intent_request(FOUR)])
        assert narrow.stats.requests == 1
        await b.aclose()
    wrong_model = make_backend(standin.url, model="other")
    with pytest.raises(BackendRejected, match="does not exist"):
        await wrong_model.read([intent_request(FOUR)])
    await wrong_model.aclose()
    standin.faults.append(Reply(500, {"error": {"message": "CUDA error"}}))
    ok = make_backend(standin.url)
    [scores] = await ok.read([intent_request(FOUR)])  # one sparing retry
    assert scores.top[0] == "card_arrival"
    await ok.aclose()
    down = make_backend(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendUnavailable):
        await down.read([intent_request(FOUR)])
    assert await down.ready() is False
    await down.aclose()


def test_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="tokenizer_path"):
        VllmBackend("http://x")
    with pytest.raises(ConfigError, match="does not exist"):
        VllmBackend("http://x", VllmOptions(tokenizer_path=Path("/nonexistent/tokenizer")))
    with pytest.raises(ConfigError, match="canvas holds 7"):
        make_backend("http://x", canvas_length=8)
    bpe_tokenizer()  # saved under var/ for the settings below
    settings = FastBackendSettings(kind="vllm", url="http://127.0.0.1:1",
                                   model_path=BPE_TOKENIZER_DIR, options={"label_cap": 40})
    backend = VllmBackend.from_settings(settings)
    assert len(backend.alphabet) == 40
    with pytest.raises(ValueError, match="label_prefix: not an option of this backend"):
        FastBackendSettings(kind="vllm", url="http://x", options={"label_prefix": " "})
    with pytest.raises(ValueError, match="steps: Input should be less than or equal to 8"):
        FastBackendSettings(kind="vllm", url="http://x", options={"steps": 9})


def test_option_descriptions_appear_in_the_prompt() -> None:
    backend = make_backend("http://x")
    request = dataclasses.replace(intent_request(FOUR),
                                  options=(Option("a", "first"), Option("b", None)))
    text = backend.build_body(request, draw=0)["messages"][0]["content"]
    assert "  A: a (first)\n  B: b" in text


async def test_concurrency_cap_holds_at_the_server(standin: VllmStandin) -> None:
    standin.delay_s = 0.05
    b = make_backend(standin.url, max_concurrency=2)
    scores = await b.read([intent_request(FOUR, samples=3, seed=k) for k in range(3)])
    assert len(scores) == 3 and standin.stats.requests == 9
    assert standin.stats.max_in_flight == 2
    await b.aclose()


def test_the_app_factory_builds_it() -> None:
    from router.backends.factory import build_backend

    bpe_tokenizer()
    settings = FastBackendSettings(kind="vllm", url="http://127.0.0.1:1",
                                   model_path=BPE_TOKENIZER_DIR, options={"samples": 2})
    backend = build_backend(settings)
    assert isinstance(backend, VllmBackend) and backend.options.samples == 2
