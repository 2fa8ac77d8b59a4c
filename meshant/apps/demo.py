"""``meshant demo``: a local colony doing a realistic mixed workload, end to end."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from functools import partial
from typing import Any

import click

from meshant.actors.client import Client
from meshant.apps import _procs
from meshant.apps.stats import summary
from meshant.errors import MeshantError, TaskFailed

STORY = ("the queen hands out work and the foragers stream their answers back "
         "word by word like a language model streaming tokens")


def run_demo(foragers: int = 3, tasks: int = 300, as_json: bool = False) -> bool:
    """Start a queen and ``foragers`` foragers, run the workload, stop them. True if all ok."""
    def say(message: str) -> None:
        if not as_json:
            click.echo(message, err=True)

    procs: list[Any] = []
    client: Client | None = None
    report: dict[str, Any] = {"ok": False}
    journal_dir = ""
    t_start = time.monotonic()
    try:
        # The demo's queen journals like any other, to a file of its own it removes after.
        journal_dir = tempfile.mkdtemp(prefix="meshant-demo-")
        queen = _procs.spawn(["queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                              "tcp://127.0.0.1:0", "--json", "--assign-timeout", "10",
                              "--hb-interval", "0.25", "--hb-misses", "4",
                              "--journal", os.path.join(journal_dir, "demo-queen.db")])
        procs.append(queen)
        ready = _procs.read_json_line(queen, 20)
        endpoint = ready["router"]
        say(f"queen up at {endpoint}")
        fprocs = []
        names = iter(range(1, 1000))

        def spawn_forager() -> Any:
            fp = _procs.spawn(["forager", "--queen", endpoint, "--slots", "4",
                               "--name", f"demo-forager-{next(names)}", "--json",
                               "--app", "meshant.apps.demo_agent:forager"])
            procs.append(fp)
            return fp
        fprocs = [spawn_forager() for _ in range(foragers)]
        for fp in fprocs:
            _procs.read_json_line(fp, 20)
        say(f"{foragers} foragers joined (4 slots each)")
        client = Client(endpoint, timeout=10)

        def respawn() -> None:
            _procs.read_json_line(spawn_forager(), 20)
        report.update(_workload(client, tasks, foragers, say, respawn, journal_dir))
        st = client.status()
        report["counters"] = st["counters"]
        report["ok"] = bool(report["checks_passed"])
    except (MeshantError, RuntimeError, OSError) as e:
        report["error"] = str(e)
        say(f"demo failed: {e}")
    finally:
        if client is not None:
            client.close()
        _procs.stop(procs)
        if journal_dir:
            shutil.rmtree(journal_dir, ignore_errors=True)
    report["seconds"] = round(time.monotonic() - t_start, 3)
    if as_json:
        click.echo(json.dumps(report))
    elif "checks" in report:
        _print_summary(report)
    return bool(report["ok"])


def _took(latencies: list[float], sent: float, _future: object) -> None:
    latencies.append(time.monotonic() - sent)


def _workload(client: Client, tasks: int, foragers: int, say: Any,
              respawn: Any = None, workdir: str = "") -> dict[str, Any]:
    rng = random.Random(7)
    checks: dict[str, bool] = {}
    total = tasks + 1 + 1 + 1 + foragers * 2
    bar_ctx = (click.progressbar(length=total, label="demo", file=sys.stderr)
               if sys.stderr.isatty() else None)
    bar = bar_ctx.__enter__() if bar_ctx is not None else None

    def tick(n: int = 1) -> None:
        if bar is not None:
            bar.update(n)

    try:
        # 1. A burst of echo tasks at mixed priorities.
        latencies: list[float] = []
        t0 = time.monotonic()
        futs = []
        for i in range(tasks):
            sent = time.monotonic()
            f = client.submit("echo", {"i": i, "text": "x" * rng.randint(10, 500)},
                              priority=rng.randint(0, 99))
            f.add_done_callback(partial(_took, latencies, sent))
            futs.append(f)
        echoed = 0
        for i, f in enumerate(futs):
            echoed += f.result(30)["i"] == i
            tick()
        t_echo = time.monotonic() - t0
        checks["echo"] = echoed == tasks
        say(f"echo: {echoed}/{tasks} correct in {t_echo:.2f} s")

        # 2. A streamed answer, word by word.
        f = client.submit("stream", {"text": STORY, "delay": 0.01})
        words = [u.value for u in f.updates(10) if u.kind == "partial"]
        f.result(10)
        checks["stream"] = " ".join(words) == STORY
        tick()
        say(f"stream: {len(words)} partial results arrived in order")

        # 3. A failure, reported with the remote exception.
        try:
            client.run("fail", {"message": "this one fails on purpose"}, result_timeout=10)
            checks["failure"] = False
        except TaskFailed as e:
            checks["failure"] = e.remote_type == "DemoError"
            say(f"fail: reported as {e.remote_type}: {e.message}")
        tick()

        # 4. A durable agent whose forager is killed mid-loop: its re-run replays the
        # model calls it recorded, and makes only the rest.
        durable = _durable_agent(client, workdir or tempfile.gettempdir(), say)
        checks["durable"] = durable["rerun_completed"] == 0 and durable["ok"]
        if respawn is not None:
            respawn()  # (the colony keeps its size for what follows)
        tick()

        # 5. Kill a forager in the middle of its work: its tasks move on, each runs once.
        sleeps = [client.submit("sleep", {"seconds": 1.5, "n": n}) for n in range(foragers * 2)]
        victim = _victim(client, sleeps)
        if victim is not None:
            name, pid = victim
            os.kill(pid, signal.SIGKILL)
            say(f"killed {name} (pid {pid}) while it ran a task")
        done = 0
        for n, f in enumerate(sleeps):
            done += f.result(30)["n"] == n
            tick()
        st = client.status()
        reissued = st["counters"]["reissued"]
        checks["reissue"] = victim is not None and done == len(sleeps) and reissued >= 1
        say(f"sleep: {done}/{len(sleeps)} completed, {reissued} reissued after the kill")
    finally:
        if bar_ctx is not None:
            bar_ctx.__exit__(None, None, None)
    lat = summary([x * 1000 for x in latencies])
    return {"checks": checks, "checks_passed": all(checks.values()), "durable": durable,
            "echo_tasks": tasks, "echo_seconds": round(t_echo, 3),
            "echo_per_second": round(tasks / t_echo, 1),
            "echo_latency_ms": {k: round(v, 3) for k, v in lat.items()}}


def _durable_agent(client: Client, workdir: str, say: Any, steps: int = 8) -> dict[str, Any]:
    """Kill the forager of a durable agent once three of its steps are journaled; the
    agent finishes elsewhere with none of its completed steps made again."""
    log = os.path.join(workdir, "agent-steps.log")
    fut = client.submit("agent", {"steps": steps, "seconds": 0.1, "log": log})
    deadline = time.monotonic() + 20
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        st = client.task_status(fut.task_id)
        if len(st.get("steps") or []) >= 3 and st.get("forager"):
            break
        time.sleep(0.02)
    journaled = len(st.get("steps") or [])
    victim = next((rec for rec in client.status()["foragers"]
                   if rec["name"] == st.get("forager") and rec.get("pid")), None)
    if victim is None:
        return {"ok": False, "rerun_completed": -1}
    os.kill(int(victim["pid"]), signal.SIGKILL)
    say(f"agent: killed {victim['name']} (pid {victim['pid']}) after {journaled} of its "
        f"{steps} model calls were journaled")
    out = fut.result(60)
    ran: dict[int, int] = {}
    with open(log) as f:
        for line in f:
            task, i, _ = line.split()
            if task == fut.task_id:
                ran[int(i)] = ran.get(int(i), 0) + 1
    again = sum(1 for i in range(journaled) if ran.get(i, 0) > 1)
    in_flight = sum(1 for i in range(journaled, steps) if ran.get(i, 0) > 1)
    say(f"agent: finished on attempt {out['attempt']}: {again} completed steps run again, "
        f"{in_flight} in flight at the kill run again")
    return {"ok": out["thoughts"] == steps and all(ran.get(i) for i in range(steps)),
            "rerun_completed": again, "journaled_at_kill": journaled,
            "in_flight_rerun": in_flight}


def _victim(client: Client, futs: list[Any]) -> tuple[str, int] | None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for f in futs:
            st = client.task_status(f.task_id)
            if st["state"] in ("assigned", "accepted") and st.get("forager"):
                for rec in client.status()["foragers"]:
                    if rec["name"] == st["forager"] and rec["pid"]:
                        return rec["name"], int(rec["pid"])
        time.sleep(0.05)
    return None


def _print_summary(r: dict[str, Any]) -> None:
    lat = r["echo_latency_ms"]
    click.echo("")
    click.echo("meshant demo summary")
    click.echo(f"  echo tasks      {r['echo_tasks']} in {r['echo_seconds']} s "
               f"({r['echo_per_second']}/s, submitted as one burst)")
    click.echo(f"  latency (ms)    p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  "
               f"p99 {lat['p99']:.2f}  max {lat['max']:.2f}")
    c = r.get("counters", {})
    click.echo(f"  queen counters  completed {c.get('completed')}  failed {c.get('failed')}  "
               f"reissued {c.get('reissued')}  duplicates dropped {c.get('duplicates')}")
    for name, ok in r["checks"].items():
        click.echo(f"  {'ok  ' if ok else 'FAIL'} {name}")
    click.echo(f"  total {r['seconds']} s — {'all checks passed' if r['ok'] else 'FAILED'}")
