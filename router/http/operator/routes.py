"""The operator page's routes under ``/operator``: the page (a sign-in form without a session),
sign-in with an admin key, sign-out, and clearing a policy's alarms. Every change is a POST that
carries the session's CSRF token; the session cookie is HttpOnly and SameSite=Strict (and Secure
over HTTPS). Without ``admin_key_hashes`` the page is off: every route answers 404 saying so."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from router.http.operator.render import html
from router.http.operator.sessions import COOKIE, PREFIX, SESSION_TTL_S, Session, Sessions
from router.http.operator.view import page_view
from router.http.state import app_state
from router.monitoring.monitor import Monitor
from router.settings import Settings

log = logging.getLogger("slotgate")
REFRESH_S = 15  # the page reloads itself this often
CLEAR_TTL_S = 7 * 24 * 3600  # a shared clear outlives any alarm it supersedes (as the CLI's)
CLEAR_DETAIL = "cleared by an operator (the operator page)"


def make_router(admin_key_hashes: Sequence[str]) -> APIRouter:
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    sessions = Sessions(admin_key_hashes)

    @router.get("")
    async def page(request: Request) -> Response:
        session = sessions.get(request.cookies.get(COOKIE))
        if not sessions.enabled or session is None:
            return _signed_out(sessions)
        view = await page_view(app_state(request))
        cleared = request.query_params.get("cleared")  # named by the clear's redirect
        flash = next((cleared_words(request, p.policy_id, cost=p.cost is not None)
                      for p in view.policies if p.policy_id == cleared), None)
        return html("page.html", view=view, csrf=session.csrf, refresh_s=REFRESH_S, flash=flash)

    @router.post("/login")
    async def login(request: Request) -> Response:
        if not sessions.enabled:
            return _signed_out(sessions)
        key = (await _form(request)).get("key", "")
        admin = sessions.admin_of(key) if key else None
        if admin is None:
            log.warning("operator page: a sign-in with a key that is no admin key")
            return html("login.html", status_code=401, ttl_h=_ttl_h(),
                        error="That is not an admin key.")
        token, _ = sessions.open(admin)
        log.info("operator page: admin key %s signed in", admin)
        response = RedirectResponse(PREFIX, status_code=303)
        response.set_cookie(COOKIE, token, max_age=int(SESSION_TTL_S), path=PREFIX,
                            secure=request.url.scheme == "https", httponly=True,
                            samesite="strict")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        token = request.cookies.get(COOKIE)
        refused = await _refusal(request, sessions.get(token), sessions)
        if refused is not None:
            return refused
        sessions.close(token)
        response = RedirectResponse(PREFIX, status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    @router.post("/alarms/clear")
    async def clear(request: Request) -> Response:
        session = sessions.get(request.cookies.get(COOKIE))
        refused = await _refusal(request, session, sessions)
        if refused is not None:
            return refused
        assert session is not None
        policy_id = (await _form(request)).get("policy_id", "")
        monitor = app_state(request).service.monitor
        if not isinstance(monitor, Monitor) or policy_id not in monitor.watches:
            known = ", ".join(sorted(monitor.watches)) if isinstance(monitor, Monitor) else "none"
            return html("message.html", status_code=404, back=True,
                        message=f"policy_id: no watched policy {policy_id!r} (watched: {known}).")
        at = time.time()
        # here, and logged: a restart does not re-arm them
        monitor.clear(policy_id, at, detail=CLEAR_DETAIL)
        log.warning("operator page: admin key %s cleared the alarms of policy %s", session.admin,
                    policy_id)
        failed = await _share_clear(app_state(request).settings, policy_id, at)
        if failed is not None:
            return html("message.html", status_code=503, back=True, message=(
                f"The alarms of policy {policy_id} are cleared here and the clear is logged, "
                f"but it was not shared through Redis ({failed}): other replicas clear when "
                "restarted, or clear again."))
        return RedirectResponse(f"{PREFIX}?cleared={quote(policy_id)}", status_code=303)

    return router


async def _share_clear(settings: Settings, policy_id: str, at: float) -> str | None:
    """With a shared Redis, the clear as ``slotgate alarms clear --redis-url`` writes it: the
    clear record set and the shared alarms raised at or before it deleted, at once, so every
    replica clears within ``monitoring.alarm_sync_s``. The error's words when Redis fails."""
    if not settings.cache.redis_url or not settings.monitoring.share_alarms:
        return None
    from router.store.alarm_board import RedisAlarmBoard
    from router.store.redis_client import redis_errors

    board = RedisAlarmBoard(settings.cache.redis_url, ttl_s=CLEAR_TTL_S)
    try:
        await board.clear(policy_id, at, CLEAR_DETAIL)
    except redis_errors() as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await board.aclose()
    return None


def cleared_words(request: Request, policy_id: str, *, cost: bool) -> str:
    """``cost``: the policy has a cost promise (the clear ended a breach of it too)."""
    settings = app_state(request).settings
    shared = bool(settings.cache.redis_url) and settings.monitoring.share_alarms
    return (f"Cleared the alarms of policy {policy_id}"
            + (", a broken cost promise included (its check starts afresh)" if cost else "")
            + ": logged in the decision log"
            + ("; shared through Redis, every replica clears within monitoring.alarm_sync_s."
               if shared else "; other replicas clear when restarted (no shared Redis)."))


async def _refusal(request: Request, session: Session | None,
                   sessions: Sessions) -> Response | None:
    """The answer to a change the request may not make: signed out (the sign-in form, 401), or
    its form's CSRF token missing or not its session's (403); None when it may."""
    if not sessions.enabled or session is None:
        return _signed_out(sessions, status_code=401)
    if not session.carries((await _form(request)).get("csrf")):
        log.warning("operator page: a change refused for a missing or wrong CSRF token")
        return html("message.html", status_code=403, back=True,
                    message="Refused: the form's CSRF token is missing or is not this "
                            "session's. Reload the page and try again.")
    return None


def _signed_out(sessions: Sessions, *, status_code: int = 200) -> Response:
    if not sessions.enabled:
        return html("message.html", status_code=404, back=False,
                    message="The operator page is off: set admin_key_hashes (the sha256 hex "
                            "digests of the admin keys) to turn it on.")
    return html("login.html", status_code=status_code, ttl_h=_ttl_h(), error=None)


async def _form(request: Request) -> dict[str, str]:
    """The first value of each field of a URL-encoded form body (other bodies: no fields)."""
    if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"):
        return {}
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def _ttl_h() -> int:
    return round(SESSION_TTL_S / 3600)
