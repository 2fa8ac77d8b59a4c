#!/usr/bin/env python3
"""Durable steps under fire: foragers SIGKILLed, queens failed over — no step runs twice
but the one in flight at a kill.

    python -m benchmarks.durable_soak [--kills 100] [--failovers 5] [--restarts 5]
                                      [--restart-down 0.3] [--only a|b|c]
                                      [--foragers 2] [--slots 4] [--json [FILE]]

(a) forager kills: a CLI queen on a file journal (SQLite), CLI foragers serving
benchmarks/durable_soak_app.py (``soak``: 10 ``ctx.step`` calls, each appending ``TASK
STEP PID`` to a log as it starts, with small random sleeps), a client keeping a window of
tasks in flight. A forager is SIGKILLed at random moments ``--kills`` times (another
started each time). (b) failovers: two CLI queens on one PostgreSQL database (a
throwaway server, tests/pg_server.py, or ``--postgres URL``), leader and standby; the
leader is SIGKILLed ``--failovers`` times, the standby takes over, the killed one is
started again as the standby; foragers and client are given both endpoints and follow
the leader. (c) queen restarts: one CLI queen on a file journal SIGKILLed and started
again on the same endpoint ``--restarts`` times, down ``--restart-down`` s each time.
In (b) and (c) no forager dies: no step should run twice at all.

Then the client waits for every task, and the checks: each task completed with its own
result; in the log, a step index seen more than once for a task must have been the step
in flight when a forager running that task was killed (its earlier run's pid is a killed
forager's, and that run's last step of the task) — at most one re-run step per kill per
task. Anything else is a step that ran twice when it should not (must be 0). The journal
is also verified (``journal verify``: must find nothing). Exit status 1 if any check
fails.

Only 127.0.0.1 and ipc:// are used; every process started is stopped by its PID, on
Ctrl-C too. Not part of the test run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshant import Client
from meshant.errors import MeshantError

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.durable_soak_app:forager"
HB = ["--hb-interval", "0.2", "--hb-misses", "5"]
STEPS = 10


def soak_options(ap: argparse.ArgumentParser, database_for: str, kept: str) -> None:
    """The options every soak ends with: a database, a work directory kept, JSON."""
    ap.add_argument("--postgres", metavar="URL", help=f"a database {database_for} (else a "
                    "throwaway server is started with initdb)")
    ap.add_argument("--keep", metavar="DIR", help=f"work in DIR (new) and keep it: {kept}")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="the figures as JSON (to FILE, or stdout)")


def interrupt_on_sigterm() -> None:
    """SIGTERM stops a soak as Ctrl-C does: through its cleanup, every process stopped."""
    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)


def write_json(value: Any, dest: str) -> None:
    """A benchmark's ``--json`` output: to stdout for ``-``, else to file ``dest``."""
    text = json.dumps(value, indent=1)
    if dest == "-":
        print(text)
    else:
        Path(dest).write_text(text + "\n")


def endpoint(tmp: Path, name: str) -> str:
    """The router endpoint of queen ``name`` (``Procs.queen``)."""
    return f"ipc://{tmp}/{name}"


def leads(endpoint: str) -> bool:
    """Whether the queen at ``endpoint`` leads (asked itself, not followed)."""
    try:
        with Client(endpoint, follow_leader=False, timeout=1) as c:
            return bool(c.status(timeout=1)["role"] == "leader")
    except MeshantError:
        return False


def wait_lead_at(endpoint: str, timeout: float) -> float:
    """Seconds until the queen at ``endpoint`` leads; RuntimeError past ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if leads(endpoint):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise RuntimeError(f"{endpoint} did not lead within {timeout} s")


class Procs:
    """meshant CLI processes, their stdout and stderr in files (nothing to fill a pipe);
    all stopped by PID in :meth:`close`."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.all: list[subprocess.Popen[bytes]] = []
        self.n = 0

    def start(self, *args: str, timeout: float = 30) -> tuple[subprocess.Popen[bytes],
                                                              dict[str, Any]]:
        self.n += 1
        out, err = self.tmp / f"p{self.n}.out", self.tmp / f"p{self.n}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            p = subprocess.Popen([sys.executable, "-m", "meshant", *args], stdout=o,
                                 stderr=e, stdin=subprocess.DEVNULL, cwd=ROOT,
                                 env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"})
        self.all.append(p)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in out.read_text().splitlines():
                if line.startswith("{"):
                    return p, json.loads(line)
            if p.poll() is not None:
                raise RuntimeError(f"{args[0]} exited {p.returncode}: "
                                   f"{err.read_text()[-2000:]}")
            time.sleep(0.02)
        raise RuntimeError(f"{args!r} printed no ready line within {timeout} s")

    def queen(self, name: str, url: str, lease: float, *extra: str) -> subprocess.Popen[bytes]:
        """A CLI queen ``name`` on ipc endpoints in the temp dir, journal ``url``."""
        p, info = self.start("queen", "--name", name, "--bind", endpoint(self.tmp, name),
                             "--pub", f"ipc://{self.tmp}/{name}-pub", "--json", "--journal",
                             url, "--lease", str(lease), *extra)
        assert info.get("role") in ("leader", "standby"), info
        return p

    def close(self, timeout: float = 5.0) -> None:
        for p in self.all:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.all:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


class Pump:
    """A client thread keeping ``window`` tasks of ``capability`` in flight until
    stopped; the k-th task's payload is ``first + k * step`` (several pumps: disjoint)."""

    def __init__(self, c: Client, window: int, max_attempts: int,
                 capability: str = "soak", first: int = 0, step: int = 1) -> None:
        self.c, self.window, self.max_attempts = c, window, max_attempts
        self.capability, self.first, self.step = capability, first, step
        self.futs: list[tuple[int, Any]] = []
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        inflight: list[Any] = []
        while not self.stop.is_set():
            inflight = [f for f in inflight if not f.done()]
            while len(inflight) < self.window and not self.stop.is_set():
                n = self.first + len(self.futs) * self.step
                try:
                    fut = self.c.submit(self.capability, n, max_attempts=self.max_attempts)
                except MeshantError as e:  # (a refusal: noted, and tried again)
                    self.errors.append(f"submit {n}: {e!r}")
                    time.sleep(0.1)
                    continue
                self.futs.append((n, fut))
                inflight.append(fut)
            time.sleep(0.005)

    def completed(self) -> int:
        return sum(f.done() for _, f in self.futs)


def soak_result(n: int) -> list[int]:
    """What the soak handler returns for payload ``n``."""
    return [n * 100 + i for i in range(STEPS)]


def collect(futs: list[tuple[int, Any]], timeout: float,
            expect: Callable[[int], Any] = soak_result) -> dict[str, Any]:
    """Every task's outcome: right result (``expect(payload)``), wrong result, failed,
    or not ended in time."""
    deadline = time.monotonic() + timeout
    ok, wrong, failed, lost = 0, [], [], []
    ids: dict[str, int] = {}
    for n, fut in futs:
        ids[fut.task_id] = n
        try:
            r = fut.result(max(0.1, deadline - time.monotonic()))
        except (TimeoutError, MeshantError) as e:
            if isinstance(e, TimeoutError) and not fut.done():
                lost.append(fut.task_id)  # (not ended within the wait)
            else:
                failed.append(f"{fut.task_id}: {e!r}")
            continue
        if r == expect(n):
            ok += 1
        else:
            wrong.append(f"{fut.task_id}: {r!r}")
    return {"ok": ok, "wrong": wrong, "failed": failed, "lost": lost, "ids": ids}


def check_log(log: Path, killed: dict[int, float], ids: dict[str, int]) -> dict[str, Any]:
    """Which steps ran more than once, and whether each is allowed: the earlier runs of a
    step index by a killed forager, as its last step of that task."""
    runs: dict[str, list[tuple[int, int, float]]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        task, step, proc, at = line.split()
        runs[task].append((int(step), int(proc), float(at)))
    rerun, same_pid = 0, 0
    bad: list[str] = []
    per_kill: collections.Counter[tuple[str, int]] = collections.Counter()
    missing = []
    for tid in ids:
        seq = runs.get(tid, [])
        seen = {i for i, _, _ in seq}
        if seen != set(range(STEPS)):
            missing.append(f"{tid}: steps logged {sorted(seen)}")
        last_of: dict[int, int] = {}  # pid -> its last step index for this task
        for i, pid, _ in seq:
            last_of[pid] = i
        by_step: dict[int, list[tuple[int, float]]] = collections.defaultdict(list)
        for i, pid, t in seq:
            by_step[i].append((pid, t))
        for i, occ in by_step.items():
            for pid, began in occ[:-1]:  # every run but the last was cut short (or wrong)
                if pid in killed and last_of[pid] == i:
                    rerun += 1
                    per_kill[(tid, pid)] += 1
                elif pid not in killed:
                    bad.append(f"task {tid} step {i} ran {len(occ)}x, pids "
                               f"{[p for p, _ in occ]}; pid {pid} was not killed")
                else:
                    # It had returned (the handler went on to its next step) that long
                    # before the kill: its record was sent, and did not count.
                    after = min(t for j, p, t in seq if p == pid and t > began)
                    bad.append(f"task {tid} step {i} ran {len(occ)}x, pids "
                               f"{[p for p, _ in occ]}; pid {pid} was killed at its step "
                               f"{last_of[pid]}, {(killed[pid] - after) * 1000:.1f} ms after "
                               f"this step had returned")
            pids = [p for p, _ in occ]
            if len(pids) != len(set(pids)):
                same_pid += 1  # (one forager ran the step twice: a task given it again)
    over = [k for k, v in per_kill.items() if v > 1]
    return {"step_runs": sum(len(v) for v in runs.values()), "rerun_steps": rerun,
            "ran_twice_wrongly": len(bad), "examples": bad[:10],
            "tasks_with_wrong_reruns": len({b.split()[1] for b in bad}),
            "steps_rerun_by_the_same_forager": same_pid,
            "tasks_with_missing_steps": len(missing), "missing_examples": missing[:5],
            "more_than_one_rerun_per_kill": len(over),
            "tasks_hit_by_kills": len({t for t, _ in per_kill})}


def verify(url: str) -> list[str]:
    """What ``meshant journal verify`` finds wrong in the journal (nothing, we hope)."""
    from meshant.storage import open_journal

    j = open_journal(url, readonly=True)
    try:
        return [str(x) for x in j.verify()]
    finally:
        j.close()


def _problems(found: list[str]) -> dict[str, Any]:
    return {"journal_problems": len(found), "journal_examples": found[:5]}


def _forager(procs: Procs, queen: str, name: str, slots: int) -> subprocess.Popen[bytes]:
    p, _ = procs.start("forager", "--queen", queen, "--name", name, "--slots", str(slots),
                       "--json", "--app", APP)
    return p


def soak_kills(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    log = tmp / "steps.log"
    procs = Procs(tmp, {"MESHANT_SOAK_LOG": str(log)})
    rng = random.Random(args.seed)
    killed: dict[int, float] = {}
    try:
        journal = str(tmp / "queen.db")
        _, info = procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                              "tcp://127.0.0.1:0", "--json", "--journal", journal, *HB)
        ep = info["router"]
        up: list[tuple[subprocess.Popen[bytes], float]] = []
        nf = 0
        for _ in range(args.foragers):
            nf += 1
            up.append((_forager(procs, ep, f"f{nf}", args.slots), time.monotonic()))
        t0 = time.monotonic()
        with Client(ep, timeout=30) as c:
            pump = Pump(c, args.window, args.max_attempts, args.capability)
            pump.t.start()
            while len(killed) < args.kills:
                time.sleep(rng.uniform(args.min_gap, args.max_gap))
                # A forager that has been up a while (running tasks), at a random moment.
                ripe = [x for x in up if time.monotonic() - x[1] > 0.8] or up
                victim = rng.choice(ripe)
                victim[0].send_signal(signal.SIGKILL)
                killed[victim[0].pid] = time.time()
                victim[0].wait(10)
                up.remove(victim)
                nf += 1
                up.append((_forager(procs, ep, f"f{nf}", args.slots), time.monotonic()))
                if len(killed) % 10 == 0:
                    print(f"  (a) {len(killed)} kills, {pump.completed()} tasks done of "
                          f"{len(pump.futs)}", file=sys.stderr)
            pump.stop.set()
            pump.t.join(10)
            res = collect(pump.futs, args.wait)
            took = time.monotonic() - t0
            counters = c.status()["counters"]
    finally:
        procs.close()
        (tmp / "kills.json").write_text(json.dumps(killed))
    out = {"scenario": "forager kills (file journal)"
           + ("" if args.capability == "soak" else ", no steps"), "kills": len(killed),
           "tasks": len(res["ids"]), "completed_right": res["ok"],
           "wrong_result": len(res["wrong"]), "failed": len(res["failed"]),
           "not_ended": len(res["lost"]), "seconds": round(took, 1),
           "submit_errors": len(pump.errors),
           **check_log(log, killed, res["ids"]), **_problems(verify(journal)),
           "queen_counters": counters,
           "failed_examples": res["failed"][:5] + res["wrong"][:5],
           "not_ended_examples": res["lost"][:5]}
    return out


def soak_failovers(args: argparse.Namespace, tmp: Path, url: str) -> dict[str, Any]:
    log = tmp / "steps.log"
    procs = Procs(tmp, {"MESHANT_SOAK_LOG": str(log)})
    lease = args.lease

    def ep(name: str) -> str:
        return endpoint(tmp, name)

    def queen(name: str) -> subprocess.Popen[bytes]:
        return procs.queen(name, url, lease, *HB)

    def wait_lead(name: str, timeout: float) -> float:
        return wait_lead_at(ep(name), timeout)

    both = f"{ep('qa')},{ep('qb')}"
    takeovers = []
    try:
        qs = {"qa": queen("qa")}
        wait_lead("qa", 20)
        qs["qb"] = queen("qb")
        for i in range(args.foragers):
            _forager(procs, both, f"f{i}", args.slots)
        t0 = time.monotonic()
        leader, standby = "qa", "qb"
        with Client(both, queen_wait=60, timeout=30) as c:
            pump = Pump(c, args.window, args.max_attempts, args.capability)
            pump.t.start()
            for k in range(args.failovers):
                time.sleep(rng_uniform(args.seed + k, args.min_gap * 3, args.max_gap * 3))
                qs[leader].send_signal(signal.SIGKILL)
                qs[leader].wait(10)
                took = wait_lead(standby, lease + 20)
                takeovers.append(round(took, 2))
                qs[leader] = queen(leader)  # back, as the standby
                leader, standby = standby, leader
                print(f"  (b) failover {k + 1}: {standby} killed, {leader} leads after "
                      f"{took:.2f} s; {pump.completed()} tasks done of {len(pump.futs)}",
                      file=sys.stderr)
            time.sleep(2)
            pump.stop.set()
            pump.t.join(10)
            res = collect(pump.futs, args.wait)
            took_all = time.monotonic() - t0
            counters = c.status()["counters"]
    finally:
        procs.close()
    return {"scenario": "queen failovers (PostgreSQL, leader + standby)"
            + ("" if args.capability == "soak" else ", no steps"),
            "failovers": len(takeovers), "takeover_s": takeovers, "kills": 0,
            "tasks": len(res["ids"]), "completed_right": res["ok"],
            "wrong_result": len(res["wrong"]), "failed": len(res["failed"]),
            "not_ended": len(res["lost"]), "seconds": round(took_all, 1),
            "submit_errors": len(pump.errors),
            **check_log(log, {}, res["ids"]), **_problems(verify(url)),
            "queen_counters": counters,
            "failed_examples": res["failed"][:5] + res["wrong"][:5],
            "not_ended_examples": res["lost"][:5]}


def soak_restarts(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """(c) one CLI queen on a file journal, SIGKILLed and started again on the same
    endpoint and journal ``--restarts`` times, down ``--restart-down`` seconds each time."""
    log = tmp / "steps.log"
    procs = Procs(tmp, {"MESHANT_SOAK_LOG": str(log)})
    journal, ep = str(tmp / "queen.db"), f"ipc://{tmp}/q"
    qargs = ("queen", "--bind", ep, "--pub", f"ipc://{tmp}/q-pub", "--json", "--journal",
             journal, *HB)
    kills = []
    try:
        q, _ = procs.start(*qargs)
        for i in range(args.foragers):
            _forager(procs, ep, f"f{i}", args.slots)
        t0 = time.monotonic()
        with Client(ep, queen_wait=60, timeout=30) as c:
            pump = Pump(c, args.window, args.max_attempts, args.capability)
            pump.t.start()
            for k in range(args.restarts):
                time.sleep(rng_uniform(args.seed + 100 + k, args.min_gap * 3,
                                       args.max_gap * 3))
                q.send_signal(signal.SIGKILL)
                kills.append(time.time())
                q.wait(10)
                time.sleep(args.restart_down)
                q, _ = procs.start(*qargs)
                print(f"  (c) restart {k + 1}: {pump.completed()} tasks done of "
                      f"{len(pump.futs)}", file=sys.stderr)
            time.sleep(2)
            pump.stop.set()
            pump.t.join(10)
            res = collect(pump.futs, args.wait)
            took_all = time.monotonic() - t0
            counters = c.status()["counters"]
    finally:
        procs.close()
    return {"scenario": f"queen restarts (file journal, down {args.restart_down} s)"
            + ("" if args.capability == "soak" else ", no steps"),
            "restarts": len(kills), "kills": 0, "failovers": 0,
            "tasks": len(res["ids"]), "completed_right": res["ok"],
            "wrong_result": len(res["wrong"]), "failed": len(res["failed"]),
            "not_ended": len(res["lost"]), "seconds": round(took_all, 1),
            "submit_errors": len(pump.errors),
            **check_log(log, {}, res["ids"]), **_problems(verify(journal)),
            "queen_counters": counters,
            "failed_examples": res["failed"][:5] + res["wrong"][:5],
            "not_ended_examples": res["lost"][:5]}


def rng_uniform(seed: int, a: float, b: float) -> float:
    return random.Random(seed).uniform(a, b)


def show(r: dict[str, Any]) -> None:
    print(f"{r['scenario']}: {r['tasks']} tasks in {r['seconds']} s, "
          + (f"{r['kills']} forager kills" if r["kills"] else
             f"{r['restarts']} queen restarts" if r.get("restarts") else
             f"{r['failovers']} failovers (takeover {r['takeover_s']} s)")
          + f"; completed right {r['completed_right']}, wrong {r['wrong_result']}, "
          f"failed {r['failed']}, not ended {r['not_ended']}; step runs {r['step_runs']}, "
          f"re-run steps (in flight at a kill) {r['rerun_steps']} over "
          f"{r['tasks_hit_by_kills']} tasks, ran twice when they should not "
          f"{r['ran_twice_wrongly']} (in {r['tasks_with_wrong_reruns']} tasks; "
          f"{r['steps_rerun_by_the_same_forager']} by the same forager), tasks missing a "
          f"step {r['tasks_with_missing_steps']}, journal problems {r['journal_problems']}")
    for e in r["examples"] + r["missing_examples"] + r["journal_examples"] + r["failed_examples"] \
            + r["not_ended_examples"]:
        print("   ", e)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--restarts", type=int, default=5,
                    help="(c): queen kill -9 + restart on its file journal, this many times")
    ap.add_argument("--restart-down", type=float, default=0.3,
                    help="(c): seconds the queen stays down (under the peers' 1 s "
                    "heartbeat timeout by default: back before they miss it)")
    ap.add_argument("--only", choices=["a", "b", "c"])
    ap.add_argument("--foragers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--window", type=int, default=16, help="tasks kept in flight")
    ap.add_argument("--max-attempts", type=int, default=50,
                    help="per task: each kill of its forager costs an attempt")
    ap.add_argument("--min-gap", type=float, default=0.3, help="seconds between kills, min")
    ap.add_argument("--max-gap", type=float, default=1.5, help="seconds between kills, max")
    ap.add_argument("--lease", type=float, default=1.0)
    ap.add_argument("--wait", type=float, default=300, help="seconds to wait for the tasks")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-steps", dest="capability", action="store_const",
                    const="soak_plain", default="soak",
                    help="the control: the same handler without ctx.step (re-runs expected)")
    soak_options(ap, "for (b)", "the step log, every process's output, the file journals")
    args = ap.parse_args(argv)
    interrupt_on_sigterm()
    results = []
    with tempfile.TemporaryDirectory(prefix="meshant-dsoak-") as d:
        tmp = Path(d)
        if args.keep:  # (the logs and journals kept, to look into what went wrong)
            tmp = Path(args.keep)
            tmp.mkdir(parents=True)
        if args.only in (None, "a") and args.kills > 0:
            (tmp / "a").mkdir()
            results.append(soak_kills(args, tmp / "a"))
            show(results[-1])
        if args.only in (None, "b") and args.failovers > 0:
            (tmp / "b").mkdir()
            server = None
            url = args.postgres
            try:
                if url is None:
                    sys.path.insert(0, str(ROOT))
                    from tests.pg_server import PgServer

                    server = PgServer()
                    url = server.create_db("dsoak")
                results.append(soak_failovers(args, tmp / "b", url))
                show(results[-1])
            finally:
                if server is not None:
                    server.close()
        if args.only in (None, "c") and args.restarts > 0:
            (tmp / "c").mkdir()
            results.append(soak_restarts(args, tmp / "c"))
            show(results[-1])
    if args.json:
        write_json(results, args.json)
    bad = any(r["ran_twice_wrongly"] or r["completed_right"] != r["tasks"]
              or r["more_than_one_rerun_per_kill"] or r["journal_problems"]
              for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
