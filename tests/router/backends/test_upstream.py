"""A remote tier's fingerprint includes what its server says of itself (GET /v1/models, over
real HTTP against the vLLM and System One stand-ins): another model behind the same name is
another tier, refused by the policies tuned on the old one; a server that swaps its model
while slotgate runs fails the readiness probe and every read after it; one that cannot be asked
at start-up leaves its tier unread (decisions escalate) rather than stopping the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.backends.factory import learn_upstreams
from router.backends.options import SystemOneOptions, VllmOptions
from router.backends.systemone import SystemOneBackend
from router.backends.vllm import VllmBackend
from router.errors import BackendUnavailable, ConfigError
from router.http.app import create_app
from router.settings import Settings
from standins.systemone_server import SystemOneStandin
from standins.vllm_server import VllmStandin
from tests.conftest import free_port
from tests.router.backends.standins import bpe_tokenizer, intent_request, small_reader
from tests.router.monitoring.conftest import watched_policy

FOUR = ["card_arrival", "exchange_rate", "pin_blocked", "age_limit"]


async def learnt_vllm(standin: VllmStandin) -> tuple[VllmBackend, str, str]:
    """The backend, its fingerprint from the config alone, and once it learnt the server's."""
    backend = VllmBackend(standin.url, VllmOptions(), tokenizer=bpe_tokenizer())
    alone = backend.fingerprint
    await backend.learn_upstream()
    return backend, alone, backend.fingerprint


async def test_a_vllm_tier_is_another_tier_when_its_server_loads_other_weights(
        banking77_dir: Path) -> None:
    reader, seen = small_reader(banking77_dir), []
    for root in ("google/dgemma-1", "google/dgemma-1", "google/dgemma-2"):
        with VllmStandin(reader=reader, tokenizer=bpe_tokenizer(), root=root) as server:
            backend, alone, learnt = await learnt_vllm(server)
            assert learnt != alone
            assert backend.identity()["upstream"] == {  # type: ignore[index]
                "id": "dgemma", "root": root, "parent": None, "max_model_len": 8192}
            seen.append(learnt)
            await backend.aclose()
    # the same weights again: the same tier (the card's time and permission ids left out)
    assert seen[0] == seen[1] != seen[2]


async def test_a_server_that_swaps_its_model_while_serving_fails_readiness_and_reads(
        banking77_dir: Path) -> None:
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=bpe_tokenizer(),
                     root="google/dgemma-1") as server:
        backend, _, _ = await learnt_vllm(server)
        [read] = await backend.read([intent_request(FOUR, seed=1)])
        assert len(read.proba) == 4
        assert await backend.ready()
        server.root = "google/dgemma-2"
        assert not await backend.ready()
        served = len(server.stats.bodies)
        with pytest.raises(BackendUnavailable, match="dgemma-2.*restart slotgate"):
            await backend.read([intent_request(FOUR, seed=2)])
        assert len(server.stats.bodies) == served  # nothing read from the new model
        await backend.aclose()


async def test_a_system_one_server_says_what_it_can(banking77_dir: Path) -> None:
    reader = small_reader(banking77_dir)
    with SystemOneStandin(reader=reader) as snapshot:  # no GET /v1/models: the config alone
        backend = SystemOneBackend(snapshot.url, SystemOneOptions())
        alone = backend.fingerprint
        await backend.learn_upstream()
        assert backend.fingerprint == alone and "upstream" not in backend.identity()
        await backend.aclose()
    prints = []
    for root in ("google/dgemma-1", "google/dgemma-2"):  # djev passes vLLM's list through
        with SystemOneStandin(reader=reader, upstream_root=root) as djev:
            backend = SystemOneBackend(djev.url, SystemOneOptions())
            await backend.learn_upstream()
            prints.append(backend.fingerprint)
            await backend.aclose()
    assert len({alone, *prints}) == 3


async def test_a_policy_tuned_on_other_weights_is_refused_at_start_up(
        banking77_dir: Path, tmp_path: Path) -> None:
    """create_app's start-up learns the server's report before it checks the policies."""
    reader = small_reader(banking77_dir)
    with SystemOneStandin(reader=reader, upstream_root="google/dgemma-1") as djev:
        backend = SystemOneBackend(djev.url, SystemOneOptions())
        await backend.learn_upstream()
        tuned_on = backend.fingerprint
        await backend.aclose()
    policy = watched_policy(backend_fingerprint=tuned_on)
    policy.write(tmp_path / "policy.json")
    for root, refused in (("google/dgemma-1", False), ("google/dgemma-2", True)):
        with SystemOneStandin(reader=reader, upstream_root=root) as djev:
            settings = Settings(
                fast={"kind": "systemone", "url": djev.url},
                policy={"files": [tmp_path / "policy.json"], "default": policy.name},
                log={"decision_log_path": tmp_path / f"{root[-1]}.jsonl"},
                monitoring={"enabled": False})
            app = create_app(settings, warm_up=False)
            if refused:
                with pytest.raises(ConfigError, match=f"tuned for backend fingerprint {tuned_on}"):
                    async with app.router.lifespan_context(app):
                        pass
            else:
                async with app.router.lifespan_context(app):
                    pass


async def test_a_server_that_cannot_be_asked_at_start_up_leaves_its_tier_unread(
        banking77_dir: Path) -> None:
    """The server's start-up goes on (decisions escalate, as in any fast-tier outage): each read
    asks the server again and fails while it cannot be reached; what it reports once it answers
    was not checked against the policies, so its reads stay refused until a restart."""
    port = free_port()
    backend = VllmBackend(f"http://127.0.0.1:{port}", VllmOptions(), tokenizer=bpe_tokenizer())
    await backend.learn_upstream(strict=False)  # nothing listens yet
    with pytest.raises(BackendUnavailable):  # asked again: still nothing there
        await backend.read([intent_request(FOUR, seed=1)])
    assert not await backend.ready()
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=bpe_tokenizer(),
                     root="google/dgemma-1", port=port) as server:
        assert not await backend.ready()  # it answers now, with a model nobody checked
        with pytest.raises(BackendUnavailable, match="dgemma-1.*restart slotgate"):
            await backend.read([intent_request(FOUR, seed=1)])
        assert server.stats.bodies == []
    await backend.aclose()


async def test_a_server_that_cannot_be_asked_is_a_config_error_naming_the_field() -> None:
    """Where the fingerprint is needed now (``slotgate cache purge --tier``)."""
    backend = VllmBackend("http://127.0.0.1:9", VllmOptions(), tokenizer=bpe_tokenizer())
    with pytest.raises(ConfigError, match="fast.url: cannot learn which model") as raised:
        await learn_upstreams([("fast.url", backend)])
    assert raised.value.field == "fast.url"
    await backend.aclose()
