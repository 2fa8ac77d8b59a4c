"""``python -m meshant.sim``: run many seeds of the colony simulator, or replay one.

Every run is reproducible from its seed alone. Python salts ``hash()`` of strings per
process, and the queen's archive index uses it, so the simulator runs under
``PYTHONHASHSEED=0`` (it starts itself again with it when needed): a seed replays the
same way in any process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from typing import Any

import click

from meshant.sim.run import Result, relevant, run_seed, shrink
from meshant.sim.weather import PROFILES, profile_of


def _pinned_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "meshant.sim", *sys.argv[1:]])


def _one(job: tuple[int, str]) -> dict[str, Any]:
    """Run one seed (in a worker); a failure comes back shrunk."""
    seed, name = job
    profile = profile_of(name, seed)
    r = run_seed(seed, profile=profile)
    out: dict[str, Any] = {"seed": seed, "profile": name, "tasks": r.tasks, "steps": r.steps}
    if r.violation is not None:
        small = shrink(seed, r, runner=lambda s, d: run_seed(s, d, profile))
        assert small.violation is not None
        out.update(invariant=small.violation.invariant, detail=small.violation.detail,
                   faults=[str(f).strip() for f in small.faults],
                   without=_without(r, small), trace=relevant(small))
    return out


def _without(full: Result, small: Result) -> list[int]:
    kept = {str(f) for f in small.faults}
    return [i for i, f in enumerate(full.faults) if str(f) not in kept]


def _report(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(r))
        return
    seed = r["seed"]
    pf = f" --profile {r['profile']}" if r["profile"] != "all" else ""
    click.echo(f"seed {seed} failed: {r['invariant']}: {r['detail']}")
    click.echo(f"  replay:        python -m meshant.sim --seed {seed}{pf}")
    if r["without"]:
        click.echo(f"  shrunk replay: python -m meshant.sim --seed {seed}{pf} --without "
                   + ",".join(map(str, r["without"])))
    click.echo("  the faults that still break it:" + ("" if r["faults"] else " none"))
    for f in r["faults"]:
        click.echo(f"    {f}")
    click.echo("  the steps that led to it:")
    for line in r["trace"]:
        click.echo(f"    {line}")


@click.command()
@click.option("--seeds", "-n", type=click.IntRange(1), default=100, show_default=True,
              help="How many seeds to run.")
@click.option("--start", type=click.IntRange(0), default=0, show_default=True,
              help="The first seed (run a million overnight in slices: --start 1000000).")
@click.option("--seed", "one", type=click.IntRange(0), default=None,
              help="Replay this seed alone, and print its trace.")
@click.option("--without", default="", metavar="I,J",
              help="With --seed: leave out these faults (by index), as a shrunk replay "
                   "names them.")
@click.option("--jobs", "-j", type=click.IntRange(1), default=None,
              help="Processes to run seeds in (default: one per CPU).")
@click.option("--profile", "-p", type=click.Choice(["all", *sorted(PROFILES)]),
              default="all", show_default=True,
              help="What the runs are made of (meshant/sim/weather.py): 'all' runs each "
                   "seed in the profile its number picks, so every profile gets its share.")
@click.option("--cost", "cost", type=click.IntRange(1), default=None, metavar="N",
              help="Measure instead: the queen's CPU per virtual second with N idle "
                   "foragers and a trickle of tasks (meshant/sim/cost.py).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per failure.")
def main(seeds: int, start: int, one: int | None, without: str, jobs: int | None,
         profile: str, cost: int | None, as_json: bool) -> None:
    """Run the whole colony in the deterministic simulator: the real queen core,
    forager and client sessions and journal over a simulated network and clock, through
    seeded faults (queens killed mid-turn, failover with a deposed leader, foragers
    crashed and paused, partitions, duplicated and late messages, garbage), with every
    promise checked at every step and at the end.

    Each seed draws its own weather too: which faults and how often, the network's
    delays and pipes, clock drift and skew, failing journal reads, durability, the
    queen's turn, the workload's size.

    Prints one line, ``N seeds, F failed, T tasks, S s``, and exits 0 only when F is 0.
    A failure prints its seed, a shrunk set of faults, the steps that led to it, and the
    commands that replay it.
    """
    _pinned_hash_seed()
    t0 = time.perf_counter()
    if cost is not None:
        from meshant.sim.cost import measure

        c = measure(cost)
        click.echo(json.dumps({"foragers": c.foragers, "virtual_seconds": c.seconds,
                               "queen_cpu": round(c.cpu, 4), "core_share": c.cpu_share,
                               "messages": c.messages, "tasks": c.tasks})
                   if as_json else c.summary())
        return
    if one is not None:
        skip = frozenset(int(x) for x in without.split(",") if x.strip())
        replay = run_seed(one, skip, profile_of(profile, one))
        for line in replay.trace:
            click.echo(line)
        if replay.violation is not None:
            click.echo(f"seed {one} failed: {replay.violation}")
        click.echo(f"1 seeds, {int(not replay.ok)} failed, {replay.tasks} tasks, "
                   f"{time.perf_counter() - t0:.1f} s")
        sys.exit(0 if replay.ok else 1)
    jobs = jobs or os.cpu_count() or 1
    failed = tasks = done = 0
    tty = sys.stderr.isatty()
    todo = range(start, start + seeds)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs) if jobs > 1 else _Inline() as pool:
        jobs_ = [(s, profile) for s in todo]
        for r in pool.imap_unordered(_one, jobs_,
                                     chunksize=max(1, min(50, seeds // (jobs * 8)))):
            done += 1
            tasks += r["tasks"]
            if "invariant" in r:
                failed += 1
                _report(r, as_json)
            if tty and done % 100 == 0:
                click.echo(f"  {done}/{seeds} seeds, {failed} failed, "
                           f"{time.perf_counter() - t0:.0f} s", err=True)
    click.echo(f"{seeds} seeds, {failed} failed, {tasks} tasks, "
               f"{time.perf_counter() - t0:.1f} s")
    sys.exit(0 if failed == 0 else 1)


class _Inline:
    """A pool of one: the seeds run in this process."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    @staticmethod
    def imap_unordered(fn: Any, items: Any, chunksize: int = 1) -> Any:
        return map(fn, items)


__all__ = ["main"]
