"""Prometheus metrics of one app instance, on its own CollectorRegistry (never the global one),
so two apps in one process (tests, workers) never share or collide on counters."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

STAGES = ("cache", "fast", "slow", "total")
# Fast reads are tens of ms, slow calls seconds: one bucket ladder covering both.
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


_SURFACES = {"/v1/chat/completions": "openai", "/v1/systemone": "systemone",
             "/v1/feedback": "feedback", "/v1/models": "openai"}


def surface_of(path: str) -> str:
    """A bounded label set: unknown paths (scans, typos) all count as "other"."""
    if path in ("/healthz", "/readyz", "/metrics"):
        return "ops"
    return _SURFACES.get(path, "other")


class Metrics:
    """The counters the router keeps; methods name the event, not the metric type."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "slotgate_requests", "HTTP requests by surface and outcome route",
            ["surface", "route"], registry=r)
        self._responses = Counter(
            "slotgate_responses", "HTTP responses by surface and status code",
            ["surface", "status"], registry=r)
        self._decisions = Counter(
            "slotgate_decisions", "Decisions by route (failed: the escalation failed and the "
            "client got an error)", ["route"], registry=r)
        self._escalation_rate = Gauge(
            "slotgate_escalation_rate",
            "Share of decisions sent to the slow path or its cache, since start, whether the "
            "escalation was answered or failed", registry=r)
        self._latency = Histogram(
            "slotgate_stage_latency_seconds", "Latency per stage", ["stage"],
            buckets=_BUCKETS_S, registry=r)
        self._cache = Counter(
            "slotgate_cache_lookups", "Cache lookups by store (read|slow) and result (hit|miss)",
            ["store", "result"], registry=r)
        self._cache_errors = Counter(
            "slotgate_cache_errors", "Cache operations that failed (served without the cache)",
            registry=r)
        self._reads_shared = Counter(
            "slotgate_fast_reads_shared",
            "Fast reads that waited on an identical read in flight instead of reading "
            "(routing/shared_reads.py)", registry=r)
        self._backend_errors = Counter(
            "slotgate_backend_errors", "Fast-backend failures by kind (each one escalated)",
            ["kind"], registry=r)
        self._unlogged = Counter(
            "slotgate_unlogged_records",
            "Records the decision log file could not take (a full disk) and did not keep in "
            "memory (beyond log.spool_bytes): decisions were still answered, labels refused "
            "with 503", ["kind"], registry=r)
        self._tier_reads = Counter(
            "slotgate_tier_reads",
            "Reads a cascade policy judged, by fast tier and whether the tier accepted the "
            "answer (a tier's accepted share: its coverage of what reached it)",
            ["tier", "accepted"], registry=r)
        # By key namespace: bounded by the configured API keys.
        self._budget_charged = Counter(
            "slotgate_budget_charged_units",
            "Units of per-key escalation budget spent on slow calls (budget.call_cost each)",
            ["namespace"], registry=r)
        self._budget_spent = Counter(
            "slotgate_budget_spent_decisions",
            "Decisions that needed the slow model after their key's budget was spent, by what "
            "they got instead (budget.on_spent)", ["namespace", "on_spent"], registry=r)
        self._queue_rejections = Counter(
            "slotgate_queue_rejections", "Requests refused with 429 because a queue was full",
            ["backend"], registry=r)
        # Production monitoring, per policy id (router/monitoring): bounded by the policy files.
        self._policy_accept_share = Gauge(
            "slotgate_policy_accept_share",
            "Share of the policy's last 1000 decisions accepted by the fast tier", ["policy"],
            registry=r)
        self._policy_reference_share = Gauge(
            "slotgate_policy_reference_accept_share",
            "Share of the tuning rows the policy accepted", ["policy"], registry=r)
        self._policy_accuracy_lower = Gauge(
            "slotgate_policy_accuracy_lower_bound",
            "Anytime-valid lower confidence bound on accepted accuracy (audits weighted by "
            "their draw probability)",
            ["policy"], registry=r)
        self._policy_accuracy_upper = Gauge(
            "slotgate_policy_accuracy_upper_bound",
            "Anytime-valid upper confidence bound on accepted accuracy", ["policy"], registry=r)
        self._policy_labels = Gauge(
            "slotgate_policy_labels", "Audit labels behind the accuracy bounds",
            ["policy"], registry=r)
        self._policy_drift = Gauge(
            "slotgate_policy_drift_log_martingale",
            "Log of the drift martingale on confidences (alarm at log(1/alpha))", ["policy"],
            registry=r)
        self._policy_alarm = Gauge(
            "slotgate_policy_alarm", "1 while the policy is in alarm (drift or accuracy)",
            ["policy", "kind"], registry=r)
        self._cost_slow_share = Gauge(
            "slotgate_policy_slow_share",
            "Share of the policy's decisions its own verdict escalated, since start (its cost "
            "promise's check)", ["policy"], registry=r)
        self._cost_martingale = Gauge(
            "slotgate_policy_cost_log_martingale",
            "Log of the cost promise's test martingale (alarm at log(1/alpha))", ["policy"],
            registry=r)
        self._cost_blocks = Gauge(
            "slotgate_policy_cost_blocks",
            "Full blocks of the cost promise since start: all, and those past its slow share",
            ["policy", "blocks"], registry=r)
        self._cost_alarm = Gauge(
            "slotgate_policy_cost_alarm", "1 once the cost promise's check found it broken",
            ["policy"], registry=r)
        self._audits = Counter(
            "slotgate_audits", "Audits of accepted decisions by result (done|dropped|failed)",
            ["policy", "result"], registry=r)
        self._reloads = Counter(
            "slotgate_policy_reloads", "Policy reloads (SIGHUP, file watch) by result "
            "(loaded|refused)", ["result"], registry=r)
        self._redis_up = Gauge(
            "slotgate_redis_up", "1 while the configured Redis answers, 0 while it does not "
            "(decisions are then served without the cache)", registry=r)
        self._fast_fallbacks = Gauge(
            "slotgate_fast_backend_fallbacks", "Fallbacks the fast backend serves with (kernels "
            "off after a failed check, a failed warm-up); /readyz lists them", registry=r)
        self._prefix_cache = Counter(
            "slotgate_fast_backend_prefix_cache", "Static-prefix cache lookups of the fast "
            "backend's reader by result (hit|miss: a miss encodes a question's prefix again); "
            "brought up to date when /readyz or /metrics is read", ["result"], registry=r)
        self._near_misses = Counter(
            "slotgate_question_near_miss",
            "Unscoped decisions whose question differs from a loaded policy's in one field only "
            "(id, instructions, context, kind or options): a question that may have lost its "
            "policy by a small change, by policy and field", ["policy", "field"], registry=r)
        self._near_miss_seen: set[tuple[str, str]] = set()
        self._prefix_seen = {"hit": 0, "miss": 0}
        self._n_decisions = 0
        self._n_escalated = 0
        self._before_render: list[Callable[[], None]] = []
        for stage in STAGES:  # expose every stage from the start, so dashboards see zeros
            self._latency.labels(stage=stage)
        for result in ("loaded", "refused"):
            self._reloads.labels(result=result)

    def request(self, *, surface: str, route: str) -> None:
        self._requests.labels(surface=surface, route=route).inc()

    def response(self, path: str, status: int) -> None:
        """Every HTTP response, by surface (from the path) and status; the gate calls it."""
        self._responses.labels(surface=surface_of(path), status=str(status)).inc()

    def decision(self, *, route: str, escalated: bool) -> None:
        """One decision, by the route it was served on ("failed": an escalation that failed
        and was refused); ``escalated``: it was sent to the slow path, answered or not."""
        self._decisions.labels(route=route).inc()
        self._n_decisions += 1
        self._n_escalated += int(escalated)
        self._escalation_rate.set(self._n_escalated / self._n_decisions)

    def stage(self, stage: str, seconds: float) -> None:
        self._latency.labels(stage=stage).observe(seconds)

    def cache_lookups(self, *, store: str, hits: int, misses: int) -> None:
        if hits:
            self._cache.labels(store=store, result="hit").inc(hits)
        if misses:
            self._cache.labels(store=store, result="miss").inc(misses)

    def reads_shared(self, count: int) -> None:
        if count:
            self._reads_shared.inc(count)

    def cache_error(self, _message: str = "") -> None:
        """The cache's ``on_error`` callback."""
        self._cache_errors.inc()

    def unlogged(self, kind: str) -> None:
        """The decision log's ``on_unlogged`` callback: one record of ``kind`` dropped or refused."""
        self._unlogged.labels(kind=kind).inc()

    def backend_error(self, kind: str) -> None:
        self._backend_errors.labels(kind=kind).inc()

    def tier_read(self, tier: str, *, accepted: bool) -> None:
        self._tier_reads.labels(tier=tier, accepted=str(accepted).lower()).inc()

    def question_near_miss(self, policy_id: str, field: str) -> bool:
        """Count one near miss; True the first time this process counts it for that policy and
        field (the caller logs it then, once)."""
        self._near_misses.labels(policy=policy_id, field=field).inc()
        first = (policy_id, field) not in self._near_miss_seen
        self._near_miss_seen.add((policy_id, field))
        return first

    def budget_charged(self, namespace: str, units: float) -> None:
        self._budget_charged.labels(namespace=namespace).inc(units)

    def budget_spent(self, namespace: str, on_spent: str) -> None:
        self._budget_spent.labels(namespace=namespace, on_spent=on_spent).inc()

    def queue_rejected(self, backend: str) -> None:
        self._queue_rejections.labels(backend=backend).inc()

    def policy_reload(self, result: str) -> None:
        self._reloads.labels(result=result).inc()

    def redis_up(self, up: bool) -> None:
        self._redis_up.set(1.0 if up else 0.0)

    def fast_backend_fallbacks(self, count: int) -> None:
        self._fast_fallbacks.set(float(count))

    def fast_backend_prefix_cache(self, *, hits: int, misses: int) -> None:
        """The reader's running totals (``PrefixLRU.stats``): the counter takes what is new."""
        for result, total in (("hit", hits), ("miss", misses)):
            new = total - self._prefix_seen[result]
            if new > 0:
                self._prefix_cache.labels(result=result).inc(new)
                self._prefix_seen[result] = total

    def policy_state(self, state: dict[str, object]) -> None:
        """A PolicyWatch snapshot (``router.monitoring.watch``) as gauges."""
        policy = str(state["policy_id"])
        for gauge, key in ((self._policy_accept_share, "accept_share"),
                           (self._policy_reference_share, "reference_accept_share"),
                           (self._policy_accuracy_lower, "accuracy_lower"),
                           (self._policy_accuracy_upper, "accuracy_upper"),
                           (self._policy_labels, "labels"),
                           (self._policy_drift, "drift_log_martingale")):
            value = state.get(key)
            if isinstance(value, int | float):
                gauge.labels(policy=policy).set(float(value))
        for kind in ("drift", "accuracy"):
            self._policy_alarm.labels(policy=policy, kind=kind).set(
                1.0 if state.get("alarm") == kind else 0.0)

    def cost_state(self, state: dict[str, object]) -> None:
        """A cost check's report (``router.monitoring.cost.CostWatch.report``) as gauges."""
        policy = str(state["policy_id"])
        for gauge, key in ((self._cost_slow_share, "slow_share"),
                           (self._cost_martingale, "log_martingale")):
            value = state.get(key)
            if isinstance(value, int | float):
                gauge.labels(policy=policy).set(float(value))
        for blocks, key in (("all", "blocks"), ("over_share", "blocks_over")):
            value = state.get(key)
            if isinstance(value, int):
                self._cost_blocks.labels(policy=policy, blocks=blocks).set(value)
        self._cost_alarm.labels(policy=policy).set(1.0 if state.get("alarm") else 0.0)

    def forget_policy(self, policy: str) -> None:
        """Drop a retired policy's series (its gauges and audit counters)."""
        series: list[tuple[Gauge | Counter, tuple[str, ...]]] = [
            (gauge, (policy,)) for gauge in (
                self._policy_accept_share, self._policy_reference_share,
                self._policy_accuracy_lower, self._policy_accuracy_upper, self._policy_labels,
                self._policy_drift)]
        series += [(self._policy_alarm, (policy, kind)) for kind in ("drift", "accuracy")]
        series += [(gauge, (policy,)) for gauge in (
            self._cost_slow_share, self._cost_martingale, self._cost_alarm)]
        series += [(self._cost_blocks, (policy, blocks)) for blocks in ("all", "over_share")]
        series += [(self._audits, (policy, result)) for result in ("done", "dropped", "failed")]
        for metric, labels in series:
            try:
                metric.remove(*labels)
            except KeyError:  # never exported
                pass

    def audit(self, policy: str, result: str) -> None:
        self._audits.labels(policy=policy, result=result).inc()

    def on_render(self, refresh: Callable[[], None]) -> None:
        """Call ``refresh`` before each scrape (gauges that are cheaper to read than to keep)."""
        self._before_render.append(refresh)

    def render(self) -> bytes:
        for refresh in self._before_render:
            refresh()
        return generate_latest(self.registry)
