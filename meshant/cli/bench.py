"""``meshant bench``: meshant against raw pyzmq, measured side by side."""

from __future__ import annotations

import json
import sys

import click


@click.command()
@click.option("--quick", is_flag=True,
              help="Seconds instead of minutes: fewer samples, and the round trip, "
                   "pipelined, inproc and broadcast scenarios unless --scenario names "
                   "others.")
@click.option("--scenario", "-s", "scenarios", multiple=True, metavar="NAME",
              help="Run only these scenarios (repeatable); see --list.")
@click.option("--list", "list_", is_flag=True, help="List the scenarios and exit.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, writable=True),
              help="Also write the results as JSON to this file ('-' for stdout).")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False, writable=True),
              help="Also write the rows as CSV (to plot with any tool).")
@click.option("--postgres", metavar="URL", envvar="MESHANT_BENCH_POSTGRES",
              help="A PostgreSQL database (postgresql://USER@HOST:PORT/DB) for the journal "
                   "scenario's PostgreSQL rows; without it they are left out.")
def bench(quick: bool, scenarios: tuple[str, ...], list_: bool, json_file: str | None,
          csv_file: str | None, postgres: str | None) -> None:
    """Benchmark meshant against raw pyzmq on the same topology, in the same run.

    Every figure comes with the raw pyzmq figure measured alongside it and their ratio
    (meshant's cost over raw: 1.00x means as fast as raw pyzmq).
    """
    from meshant.apps.bench import QUICK, SCENARIOS, Sizes, format_table, run_suite

    if list_:
        for name, (desc, _) in SCENARIOS.items():
            click.echo(f"{name:20} {desc}")
        return
    names = list(scenarios) or list(QUICK if quick else SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise click.BadParameter(f"unknown scenario(s) {', '.join(unknown)}; see --list",
                                 param_hint="--scenario")
    sizes = Sizes.quick() if quick else Sizes()
    if postgres:
        import os

        os.environ["MESHANT_BENCH_POSTGRES"] = postgres
    elif "journal" in names:
        click.echo("journal: the PostgreSQL rows are left out (give --postgres URL)", err=True)
    to_stdout = json_file == "-"
    show = sys.stderr.isatty() and not to_stdout
    with click.progressbar(length=len(names), label="bench", file=sys.stderr,
                           item_show_func=lambda n: n, hidden=not show) as bar:
        report = run_suite(names, sizes, lambda name: bar.update(1, name))
    rows = report.pop("_rows")
    m = report["machine"]
    if not to_stdout:
        click.echo(f"machine: {m['cpus']} CPUs, Python {m['python']}, pyzmq {m['pyzmq']}, "
                   f"libzmq {m['libzmq']}, msgpack {m['msgpack']}")
        click.echo(format_table(rows))
        click.echo(f"({report['seconds']} s)")
    if json_file:
        text = json.dumps(report, indent=1)
        if to_stdout:
            click.echo(text)
        else:
            with open(json_file, "w") as fh:
                fh.write(text + "\n")
    if csv_file:
        import csv

        with open(csv_file, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["scenario", "metric", "unit", "meshant", "raw",
                                               "ratio"], extrasaction="ignore")
            w.writeheader()
            w.writerows(report["rows"])


COMMANDS = [bench]
