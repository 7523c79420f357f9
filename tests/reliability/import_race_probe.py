"""Run in a fresh interpreter by tests/reliability/test_import_race.py: slotgate served in a thread
with a slow model (so litellm's background import starts), then at once eight client threads
using the OpenAI SDK and raw HTTP send first requests (decisions that escalate and passthrough
chats). Every import statement is watched: a thread reaching a module that ANOTHER thread is
still initialising is the precondition of the partially-initialised-module failure
(router/routing/litellm_import.py). Prints one JSON line: statuses, errors, contended modules."""

from __future__ import annotations

import builtins
import json
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openai.types.shared_params import ResponseFormatJSONSchema

WARM_UP_THREAD = "slotgate-litellm-warm-up"  # router/routing/slow.py names it so
OWNER: dict[str, str] = {}
CONTENDED: list[tuple[str, str, str]] = []
_real_import = builtins.__import__


class _Owner:
    """Notes which thread starts importing each module (a finder that finds nothing)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        OWNER.setdefault(name, threading.current_thread().name)


def _watched_import(name: str, globals_: Any = None, locals_: Any = None,
                    fromlist: Any = (), level: int = 0) -> Any:
    if level == 0:
        me = threading.current_thread().name
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            module = sys.modules.get(".".join(parts[:i]))
            spec = getattr(module, "__spec__", None)
            started_by = OWNER.get(getattr(spec, "name", ""), me)
            if getattr(spec, "_initializing", False) and started_by != me:
                CONTENDED.append((me, started_by, getattr(spec, "name", "")))
    return _real_import(name, globals_, locals_, fromlist, level)


def main() -> None:
    sys.meta_path.insert(0, _Owner())
    setattr(builtins, "__import__", _watched_import)  # noqa: B010 - every import statement
    import httpx  # the client side's own imports, as a test or benchmark has them

    from bench.live import serve_in_thread
    from router.settings import Settings
    from standins.llm import start_standin

    assert "litellm" not in sys.modules
    standin = start_standin()
    work = Path(tempfile.mkdtemp(prefix="slotgate-import-race-"))
    settings = Settings(
        fast={"kind": "mock", "options": {"top_proba": 0.5}},
        slow={"model": "openai/standin", "api_base": standin.api_base,
              "api_key": "sk-probe-0123456789", "timeout_s": 240},
        log={"decision_log_path": work / "decisions.jsonl"}, policy={"fallback_threshold": 0.9})
    decision: ResponseFormatJSONSchema = {"type": "json_schema", "json_schema": {
        "name": "intent", "schema": {"type": "string", "enum": ["card_arrival", "lost_card"]}}}
    statuses: list[int] = []
    errors: list[str] = []
    with serve_in_thread(settings, loop="asyncio") as (url, _app):
        def ask(i: int) -> None:
            try:
                if i % 2:  # the OpenAI SDK, imported by this thread now, as a client does
                    import openai

                    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused",
                                           max_retries=0, timeout=240)
                    client.chat.completions.create(
                        model="any", messages=[{"role": "user", "content": f"lost card {i}"}],
                        response_format=decision if i % 4 == 1 else openai.omit)
                    statuses.append(200)
                else:
                    body: dict[str, Any] = {
                        "model": "any", "messages": [{"role": "user", "content": f"card {i}"}]}
                    if i % 4 == 0:
                        body["response_format"] = decision
                    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=240)
                    statuses.append(reply.status_code)
            except Exception as exc:  # noqa: BLE001 - reported, the test asserts on it
                errors.append(f"{type(exc).__name__}: {exc}"[:500])

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, range(16)))
    standin.stop()
    # Only meetings with the warm-up thread count: client threads racing each other for their
    # own lazy imports (httpx's httpcore, ...) are the clients' business, not the proxy's.
    warm_up = [c for c in CONTENDED if WARM_UP_THREAD in (c[0], c[1])]
    print(json.dumps({"statuses": statuses, "errors": errors,
                      "contended": sorted({c[2] for c in warm_up}),
                      "pairs": sorted(set(warm_up))[:20]}))


if __name__ == "__main__":
    main()
