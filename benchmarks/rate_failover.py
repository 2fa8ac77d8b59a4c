#!/usr/bin/env python3
"""A rate limit across a leader failover (#32): is the admitted rate of a flooded,
rate-limited capability still the limit's over every 10 s window when the leader dies?

    python -m benchmarks.rate_failover [--seconds 50] [--kills 1 | --kill-at S ...]
                                       [--rate 100] [--burst B] [--lease 1]
                                       [--foragers 8] [--backlog 1500] [--json [FILE]]

A throwaway PostgreSQL server (tests/pg_server.py; or ``--postgres URL``), two CLI queens
on it as their journal (``meshant queen --journal postgresql://... --limit
'rated=100/s'``, leader and standby), eight CLI foragers serving
benchmarks/rate_failover_app.py (``rated``: writes its own start time, the wall clock,
to a file of its forager's, and returns ``2n + 1``), and client threads that keep
``--backlog`` tasks submitted and unfinished at all times: far more demand than the
limit lets through, so the queue never runs dry and every start is the bucket's doing.
After ``--seconds`` of flood, with the leader SIGKILLed ``--kills`` times at evenly
spaced moments (the standby takes over; the killed queen comes back as the standby),
the flood stops, the backlog drains, and every task's result is checked.

The figures, from the foragers' start times: the task starts in every ``--window`` s
window (sliding by ``--step`` s, from ``--warmup`` s after the first start to the end of
the flood), as a rate: min, max, their deviation from the limit, the worst windows and
whether they hold a takeover (its gap, or the 2 s after it: the new leader's burst);
the same for the windows that hold none; each takeover's gap (the last start before the
kill to the first after it); tasks lost (not ended, a wrong result, failed) and tasks
started more than once. Exit status 1 when a task was lost or a window broke the
limit's own promise (at most ``burst + rate x window``, plus ``--jitter``: a start is
seen at its forager a little after the queen let it through).

What to expect (docs/limits.md, "Across a restart or a failover"): no leader admits
anything in the gap, so the window that ends at the new leader's first start holds only
``rate x (window - gap)``, whatever the rule; the new leader's buckets hold what they
refilled since the journal's last write, at most ``burst``, so the window that starts
there holds up to ``burst + rate x window``. ``--kill-at 2 --warmup 0 --burst 500``
kills the leader just after its first burst: the window holding both bursts is where a
new leader starting full would break the promise.

Only 127.0.0.1 and ipc:// are used; every process started is stopped by its PID, on
Ctrl-C too. Not part of the test run.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.durable_soak import (
    Procs,
    Pump,
    collect,
    endpoint,
    interrupt_on_sigterm,
    soak_options,
    verify,
    wait_lead_at,
    write_json,
)
from meshant import Client

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.rate_failover_app:forager"
CAP = "rated"
CATCH_UP = 2.0  # seconds after a takeover's first start that count as the takeover's


def windows(starts: list[float], lo: float, hi: float, width: float,
            step: float) -> list[tuple[float, int]]:
    """(window start, task starts in [t, t + width)) for t = lo, lo + step, ... while the
    window ends by ``hi``."""
    out: list[tuple[float, int]] = []
    k = 0
    while True:
        t = lo + k * step
        if t + width > hi + 1e-9:
            return out
        out.append((t, bisect.bisect_left(starts, t + width) - bisect.bisect_left(starts, t)))
        k += 1


def analyse(starts: list[float], kills: list[dict[str, float]], lo: float, hi: float,
            args: argparse.Namespace) -> dict[str, Any]:
    """The per-window figures and each takeover's gap (wall-clock seconds)."""
    gaps = []
    for k in kills:
        # The longest stretch without a start from the kill to a second after the new
        # leader leads: a task the old leader sent just before its death may start just
        # after it, and must not hide the leaderless gap that follows.
        i = bisect.bisect_right(starts, k["killed"])
        j = bisect.bisect_right(starts, k["leads"] + 1.0)
        around = starts[max(0, i - 1):j + 1]
        pairs = list(itertools.pairwise(around))
        before, after = max(pairs, key=lambda ab: ab[1] - ab[0]) if pairs else (
            float("nan"), float("nan"))
        k["last_start_before"], k["first_start_after"] = before, after
        gaps.append(round(after - before, 3))
    w = windows(starts, lo, hi, args.window, args.step)
    if not w:
        raise RuntimeError(f"no {args.window} s window between the warm-up and the end of "
                           "the flood: run longer (--seconds)")

    def holds_takeover(t: float) -> bool:
        # The gap, and the new leader's first CATCH_UP s (its buckets' burst, through
        # foragers coming back one by one).
        return any(t < k["first_start_after"] + CATCH_UP
                   and k["last_start_before"] < t + args.window for k in kills)

    def rate(n: int) -> float:
        return n / float(args.window)

    def summary(ws: list[tuple[float, int]]) -> dict[str, Any]:
        if not ws:
            return {}
        lo_w, hi_w = min(ws, key=lambda x: x[1]), max(ws, key=lambda x: x[1])
        return {"windows": len(ws),
                "min_rate": rate(lo_w[1]), "min_at": round(lo_w[0] - lo, 1),
                "min_dev_pct": round(100 * (rate(lo_w[1]) / args.rate - 1), 2),
                "min_holds_takeover": holds_takeover(lo_w[0]),
                "max_rate": rate(hi_w[1]), "max_at": round(hi_w[0] - lo, 1),
                "max_dev_pct": round(100 * (rate(hi_w[1]) / args.rate - 1), 2),
                "max_holds_takeover": holds_takeover(hi_w[0]),
                "within_2pct": sum(abs(rate(n) / args.rate - 1) <= 0.02 for _, n in ws)}

    # (Starts are seen at the foragers, a few ms after the queen let each task through:
    # a window may catch a task let through just before it. ``--jitter`` allows that.)
    promise = args.burst_used + args.rate * (args.window + args.jitter)
    return {"all": summary(w), "without_takeover": summary(
                [x for x in w if not holds_takeover(x[0])]),
            "with_takeover": summary([x for x in w if holds_takeover(x[0])]),
            "gaps_s": gaps, "over_promise": sum(n > promise + 1e-9 for _, n in w),
            "promise_per_window": promise}


def run(args: argparse.Namespace, tmp: Path, url: str) -> dict[str, Any]:
    logs = tmp / "starts"
    logs.mkdir()
    procs = Procs(tmp, {"MESHANT_RATE_LOG_DIR": str(logs),
                        "MESHANT_RATE_SLOTS": str(args.slots)})
    hb = ["--hb-interval", str(args.hb_interval), "--hb-misses", str(args.hb_misses)]
    limit = f"{CAP}={args.rate:g}/s" + (f",burst={args.burst:g}" if args.burst else "")

    def ep(name: str) -> str:
        return endpoint(tmp, name)

    def queen(name: str) -> Any:
        return procs.queen(name, url, args.lease, "--limit", limit, *hb)

    def wait_lead(name: str, timeout: float) -> None:
        wait_lead_at(ep(name), timeout)

    both = f"{ep('qa')},{ep('qb')}"
    kills: list[dict[str, float]] = []
    floods: list[Pump] = []
    try:
        qs = {"qa": queen("qa")}
        wait_lead("qa", 30)
        qs["qb"] = queen("qb")
        for i in range(args.foragers):
            procs.start("forager", "--queen", both, "--name", f"f{i}", "--json",
                        "--app", APP)
        leader, standby = "qa", "qb"
        clients = [Client(both, queen_wait=120, timeout=60) for _ in range(args.clients)]
        try:
            for i, c in enumerate(clients):
                floods.append(Pump(c, args.backlog // args.clients, 50, CAP, i, args.clients))
            t0 = time.time()
            for f in floods:
                f.t.start()
            kill_at = args.kill_at or [args.seconds * (k + 1) / (args.kills + 1)
                                       for k in range(args.kills)]
            for k, after in enumerate(sorted(kill_at)):
                at = t0 + after
                time.sleep(max(0.0, at - time.time()))
                qs[leader].send_signal(signal.SIGKILL)
                killed = time.time()
                qs[leader].wait(10)
                wait_lead(standby, args.lease + 30)
                kills.append({"killed": killed, "leads": time.time()})
                print(f"  kill {k + 1}: {leader} SIGKILLed {killed - t0:.1f} s into the flood, "
                      f"{standby} leads {time.time() - killed:.2f} s later",
                      file=sys.stderr)
                qs[leader] = queen(leader)  # back, as the standby
                leader, standby = standby, leader
            time.sleep(max(0.0, t0 + args.seconds - time.time()))
            t_end = time.time()
            for f in floods:
                f.stop.set()
            for f in floods:
                f.t.join(10)
            futs = [x for f in floods for x in f.futs]
            print(f"  flood over: {len(futs)} tasks submitted; waiting for them "
                  f"(~{args.backlog / args.rate:.0f} s of backlog)", file=sys.stderr)
            res = collect(futs, args.backlog / args.rate * 3 + 120, lambda n: 2 * n + 1)
            ok, wrong, failed = res["ok"], res["wrong"], res["failed"]
            lost = [f"{t}: not ended" for t in res["lost"]]
            ids = {fut.task_id for _, fut in futs}
        finally:
            for c in clients:
                c.close()
    finally:
        procs.close()
    starts: list[float] = []
    per_task: dict[str, int] = {}
    for p in logs.iterdir():
        for line in p.read_text().splitlines():
            task, _n, _pid, at = line.split()
            starts.append(float(at))
            per_task[task] = per_task.get(task, 0) + 1
    starts.sort()
    twice = sorted(t for t, k in per_task.items() if k > 1)
    lo = starts[0] + args.warmup
    figures = analyse(starts, kills, lo, t_end, args)
    return {"limit": limit, "burst": args.burst_used, "lease": args.lease,
            "hb": f"{args.hb_interval} s x {args.hb_misses}", "foragers": args.foragers,
            "slots": args.slots, "backlog": args.backlog, "seconds": args.seconds,
            "window": args.window, "step": args.step, "warmup": args.warmup,
            "jitter": args.jitter,
            "kills": [{"at": round(k["killed"] - lo, 2),
                       "takeover_s": round(k["leads"] - k["killed"], 2)} for k in kills],
            **figures, "tasks": len(futs), "completed_right": ok,
            "wrong_result": len(wrong), "failed": len(failed), "not_ended": len(lost),
            "started_twice": len(twice), "started_never": len(ids - set(per_task)),
            "submit_errors": sum(len(f.errors) for f in floods),
            "journal_problems": len(verify(url)),
            "examples": (wrong + failed + lost)[:5] + twice[:5]}


def show(r: dict[str, Any]) -> None:
    print(f"\nrate limit {r['limit']} (burst {r['burst']:g}), {r['foragers']} foragers x "
          f"{r['slots']} slots, {r['backlog']} tasks kept waiting, lease {r['lease']:g} s, "
          f"heartbeat {r['hb']}; {r['seconds']:g} s of flood, {r['window']:g} s windows "
          f"every {r['step']:g} s after a {r['warmup']:g} s warm-up")
    for i, (k, gap) in enumerate(zip(r["kills"], r["gaps_s"], strict=True)):
        print(f"  kill {i + 1} at +{k['at']:.1f} s after the warm-up: the standby leads after "
              f"{k['takeover_s']:.2f} s; no task started for {gap:.2f} s")
    print(f"  {'windows':<20} {'n':>5} {'min /s':>8} {'dev %':>7} {'at +s':>6} "
          f"{'max /s':>8} {'dev %':>7} {'at +s':>6} {'within 2%':>10}")
    for name, key in (("all", "all"), ("without a takeover", "without_takeover"),
                      ("holding a takeover", "with_takeover")):
        s = r[key]
        if not s:
            continue
        print(f"  {name:<20} {s['windows']:>5} {s['min_rate']:>8.1f} "
              f"{s['min_dev_pct']:>+7.2f} {s['min_at']:>6.1f} {s['max_rate']:>8.1f} "
              f"{s['max_dev_pct']:>+7.2f} {s['max_at']:>6.1f} "
              f"{s['within_2pct']:>5}/{s['windows']}")
    a = r["all"]
    print(f"  worst windows: the lowest {'holds' if a['min_holds_takeover'] else 'holds no'}"
          f" takeover, the highest {'holds' if a['max_holds_takeover'] else 'holds no'} "
          f"takeover; over the promise (burst + rate x ({r['window']:g} s + "
          f"{r['jitter']:g} s jitter) = {r['promise_per_window']:g}): "
          f"{r['over_promise']} windows")
    print(f"  tasks {r['tasks']}: completed right {r['completed_right']}, wrong "
          f"{r['wrong_result']}, failed {r['failed']}, not ended {r['not_ended']}, never "
          f"started {r['started_never']}, started twice {r['started_twice']}; journal "
          f"problems {r['journal_problems']}")
    for e in r["examples"]:
        print("   ", e)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=50, help="seconds of flood")
    ap.add_argument("--kills", type=int, default=1, help="leader SIGKILLs, evenly spaced")
    ap.add_argument("--kill-at", type=float, action="append", metavar="S",
                    help="kill the leader S seconds into the flood instead (repeatable)")
    ap.add_argument("--rate", type=float, default=100, help="the limit, tasks a second")
    ap.add_argument("--burst", type=float, help="the limit's burst (default: the rule's, "
                    "one second's worth)")
    ap.add_argument("--lease", type=float, default=1.0, help="the queens' --lease")
    ap.add_argument("--hb-interval", type=float, default=0.2)
    ap.add_argument("--hb-misses", type=int, default=5)
    ap.add_argument("--foragers", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--clients", type=int, default=2, help="client threads flooding")
    ap.add_argument("--backlog", type=int, default=1500,
                    help="tasks kept submitted and unfinished (all clients together)")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--step", type=float, default=0.1)
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds after the first start not measured (the first burst)")
    ap.add_argument("--jitter", type=float, default=0.05,
                    help="seconds a start may lag its admission, for the promise check")
    soak_options(ap, "to use", "the start logs, every process's output")
    args = ap.parse_args(argv)
    args.burst_used = args.burst or args.rate  # (parse_rate's default: N of N/s)
    interrupt_on_sigterm()
    server = None
    with tempfile.TemporaryDirectory(prefix="meshant-ratefo-") as d:
        tmp = Path(d)
        if args.keep:
            tmp = Path(args.keep)
            tmp.mkdir(parents=True)
        try:
            url = args.postgres
            if url is None:
                sys.path.insert(0, str(ROOT))
                from tests.pg_server import PgServer

                server = PgServer()
                url = server.create_db("ratefo")
            r = run(args, tmp, url)
        finally:
            if server is not None:
                server.close()
    show(r)
    if args.json:
        write_json(r, args.json)
    bad = (r["completed_right"] != r["tasks"] or r["over_promise"]
           or r["journal_problems"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
