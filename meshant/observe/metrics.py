"""The snapshot as Prometheus metrics, with the official ``prometheus-client`` library.

A custom collector turns the latest :class:`~meshant.observe.snapshot.Observer` snapshot
into metric families at scrape time: nothing is counted twice and the queen's loop does
no Prometheus work at all. Names follow the conventions: ``meshant_`` prefix, ``_total``
for counters, base units (``_seconds``). ``docs/operations.md`` lists every one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from meshant.errors import MeshantError
from meshant.observe.snapshot import BUCKETS

# (metric, help, snapshot key) for the per-capability task counters.
_TASK_COUNTERS = (
    ("meshant_tasks_submitted", "Tasks submitted, per capability.", "submitted"),
    ("meshant_tasks_completed", "Tasks completed, per capability.", "completed"),
    ("meshant_tasks_failed", "Tasks failed (dead-lettered), per capability.", "failed"),
    ("meshant_tasks_cancelled", "Tasks cancelled, per capability.", "cancelled"),
    ("meshant_tasks_reissued", "Attempts beyond the first of finished tasks (reissues "
     "after a lost forager or a timeout, and retries), per capability.", "reissued"),
)
# (metric, help, counters key): colony-wide counters.
_COUNTERS = (
    ("meshant_duplicates_dropped", "Results of abandoned attempts, recorded and dropped.",
     "duplicates"),
    ("meshant_broadcasts", "Broadcasts published.", "broadcasts"),
    ("meshant_messages", "Messages received by the queen.", "messages"),
    ("meshant_protocol_errors", "Malformed or refused messages.", "protocol_errors"),
    ("meshant_task_retries", "Tasks queued again after a backoff.", "retried"),
    ("meshant_tasks_rejected", "task.reject answers from foragers.", "rejected"),
    ("meshant_sends_dropped", "Sends dropped (peer gone or its buffer full).",
     "dropped_sends"),
    ("meshant_schedule_fired", "Tasks submitted by schedules' ticks (and triggers).",
     "schedule_fired"),
    ("meshant_schedule_refused", "Schedule ticks whose task could not be submitted (the "
     "queue full): counted as skipped.", "schedule_refused"),
)
_HISTOGRAMS = (
    ("meshant_task_queue_wait_seconds", "From submission to first assignment.",
     "queue_wait"),
    ("meshant_task_run_seconds", "From the last assignment to the final result.",
     "run_time"),
    ("meshant_task_latency_seconds", "End to end: from submission to the final result.",
     "latency"),
)


def registry_for(snapshot: Callable[[], dict[str, Any] | None]) -> Any:
    """A ``prometheus_client`` registry whose one collector reads ``snapshot()``."""
    try:
        from prometheus_client.core import CollectorRegistry
    except ImportError:
        from meshant._extras import needs

        raise MeshantError(needs("the queen's --http (prometheus-client)",
                                 "dashboard")) from None
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(snapshot))
    return reg


def exposition(registry: Any) -> tuple[bytes, str]:
    """The registry in the Prometheus text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Collector:
    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        s = self._snapshot()
        if s is None:
            return
        for name, doc, key in _TASK_COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["capability"])
            for cap, n in sorted(s[key].items()):
                c.add_metric([cap], n)
            yield c
        counters = s["counters"]
        for name, doc, key in _COUNTERS:
            yield CounterMetricFamily(name, doc, value=counters.get(key, 0))
        g = GaugeMetricFamily("meshant_queue_depth", "Tasks queued, per capability.",
                              labels=["capability"])
        for cap, n in sorted(s["queues"].items()):
            g.add_metric([cap], n)
        yield g
        yield GaugeMetricFamily("meshant_tasks_queued", "Tasks queued (all capabilities, "
                                "those waiting out a retry backoff included).",
                                value=s["queued"])
        yield GaugeMetricFamily("meshant_tasks_delayed", "Tasks delayed: not to start before "
                                "a time (submit at=/after=), in no queue yet.",
                                value=s.get("delayed", 0))
        yield GaugeMetricFamily("meshant_schedules", "Schedules the queen holds (meshant "
                                "schedule list); their firings count in "
                                "meshant_schedule_fired_total.", value=s.get("schedules", 0))
        yield GaugeMetricFamily("meshant_tasks_running", "Attempts in flight on foragers.",
                                value=s["running"])
        # Why tasks wait: the busiest limits' slots (docs/limits.md).
        run = GaugeMetricFamily("meshant_limit_running", "Tasks holding a concurrency "
                                "limit's tokens, per limit and key (the busiest 20).",
                                labels=["limit", "key"])
        held = GaugeMetricFamily("meshant_limit_waiting", "Tasks queued, held back by a "
                                 "concurrency limit, per limit and key.",
                                 labels=["limit", "key"])
        for x in s.get("limits") or []:
            run.add_metric([x["limit"], x["key"]], x["running"])
            held.add_metric([x["limit"], x["key"]], x["waiting"])
        yield run
        yield held
        rw = GaugeMetricFamily("meshant_rate_waiting", "Tasks queued, waiting for a rate "
                               "limit's bucket to refill, per limit and key.",
                               labels=["limit", "key"])
        rt = GaugeMetricFamily("meshant_rate_tokens", "Tokens in a rate limit's bucket "
                               "that tasks wait at, per limit and key.",
                               labels=["limit", "key"])
        for x in s.get("rates") or []:
            rw.add_metric([x["limit"], x["key"]], x["waiting"])
            rt.add_metric([x["limit"], x["key"]], x["tokens"])
        yield rw
        yield rt
        g = GaugeMetricFamily("meshant_foragers", "Foragers by state (offline: the recently "
                              "gone the queen remembers, at most 64).", labels=["state"])
        for state in ("active", "draining", "offline"):
            g.add_metric([state], s["foragers_by_state"].get(state, 0))
        yield g
        yield GaugeMetricFamily("meshant_clients", "Clients registered.", value=s["clients"])
        yield GaugeMetricFamily("meshant_slots_free", "Free slots on active foragers.",
                                value=s["slots_free"])
        yield GaugeMetricFamily("meshant_dead_letters", "Tasks in the dead-letter queue.",
                                value=s["dead_letters"])
        yield GaugeMetricFamily("meshant_tasks_waiting_input", "Running tasks that asked for "
                                "input and wait for an answer.", value=s["waiting_input"])
        yield GaugeMetricFamily("meshant_graphs_running", "Task graphs not yet ended.",
                                value=s["graphs_running"])
        yield GaugeMetricFamily("meshant_memory_keys", "Keys in the colony memory.",
                                value=s["memory"]["keys"])
        yield GaugeMetricFamily("meshant_heartbeats_missed", "Whole heartbeat intervals "
                                "missed now, summed over live foragers.",
                                value=s["heartbeats_missed"])
        g = GaugeMetricFamily("meshant_breakers", "Circuit breakers not closed, by kind "
                              "(forager or capability), name and state (open, half-open).",
                              labels=["kind", "name", "state"])
        for kind, table in (("forager", s["breakers"]["foragers"]),
                            ("capability", s["breakers"]["capabilities"])):
            for bname, state in sorted(table.items()):
                g.add_metric([kind, bname, state], 1)
        yield g
        j = s["journal"]
        yield CounterMetricFamily("meshant_journal_write_seconds", "Time spent writing "
                                  "the journal (one transaction per loop turn).",
                                  value=j["seconds"])
        yield CounterMetricFamily("meshant_journal_writes", "Journal transactions.",
                                  value=j["writes"])
        for name, doc, key in _HISTOGRAMS:
            h = s["histograms"][key]
            buckets: list[tuple[str, float]] = []
            total = 0
            for bound, n in zip((*BUCKETS, float("inf")), h["counts"], strict=True):
                total += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
            yield HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h["sum"])
        g = GaugeMetricFamily("meshant_queen_info", "This queen: its name, epoch and role "
                              "(leader or standby).", labels=["name", "epoch", "role"])
        q = s["queen"]
        g.add_metric([q["name"], q["epoch"], s["role"]], 1)
        yield g
        yield GaugeMetricFamily("meshant_queen_uptime_seconds", "Seconds since this queen "
                                "started serving.", value=q["uptime"])
        yield GaugeMetricFamily("meshant_queen_leader", "1 while this queen leads the colony, "
                                "0 while it is a standby.",
                                value=1 if s["role"] == "leader" else 0)
        yield GaugeMetricFamily("meshant_queen_term", "The leadership term this queen serves "
                                "(0 without a shared journal).", value=s["term"])

    def describe(self) -> list[Any]:
        return []


__all__ = ["exposition", "registry_for"]
