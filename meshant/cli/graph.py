"""``meshant graph``: task graphs — submit one (and wait for it), see one, cancel one."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from meshant.actors.graphs import GraphUpdate, nodes_of
from meshant.cli._options import JSON_OPT, Connection, client_options, jsonable
from meshant.errors import MeshantError


def _read(source: str) -> list[dict[str, Any]]:
    """The graph document from FILE or '-' (stdin); bad JSON fails here, before connecting."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text("utf-8")
    except OSError as e:
        raise click.BadParameter(f"cannot read {source}: {e.strerror}",
                                 param_hint="FILE") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="FILE") from None
    try:
        return nodes_of(doc)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="FILE") from None


@click.group()
def graph() -> None:
    """Task graphs: named nodes that wait for each other and use each other's results.

    \b
    A graph is JSON: {"nodes": {"fetch": {"capability": "http", "payload": "https://..."},
                                "parse": {"capability": "parse",
                                          "payload": {"$result": "fetch"}}}}
    A node has capability, payload, and optionally after (names it waits for),
    after_spawned (names it waits for with all they spawn), priority, timeout, labels,
    to, max_attempts, wait. {"$result": "A"} in a payload is A's result; {"$results":
    ["A", "B"]} their list; {"$spawned": "P"} the results of the nodes P spawned.
    """


def _node_line(gid: str, u: GraphUpdate, handle: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"graph": gid, "node": u.node,
                           "id": handle.nodes[u.node].task_id, "state": u.state}
    if u.error is not None:
        rec["error"] = {"code": u.error.code, "type": getattr(u.error, "remote_type", ""),
                        "message": u.error.message}
    else:
        rec["result"] = jsonable(u.result)
    return rec


@graph.command("submit")
@client_options(connect_timeout=10.0)
@click.argument("source", metavar="FILE|-")
@click.option("--wait", "wait_", is_flag=True,
              help="Wait for the graph to end; exit 1 if it failed.")
@click.option("--timeout", type=float,
              help="With --wait: give up when no node has finished for this many seconds "
                   "(the graph goes on).")
@JSON_OPT
def graph_submit(conn: Connection, source: str, wait_: bool, timeout: float | None,
                 as_json: bool) -> None:
    """Submit a graph from FILE (or '-' for stdin) and print its id.

    The queen checks the whole graph first (cycles, missing or duplicate names, its
    --max-graph-nodes): a bad graph is refused with the reason, and nothing runs. With
    --wait --json, one line per node as it finishes ({"graph", "node", "id", "state",
    "result"|"error"}) and a last line {"graph", "state"}, with "failed" naming the node
    that failed when the graph did.
    """
    nodes = _read(source)
    with conn.client() as client:
        handle = client.submit_graph(nodes)
        try:
            handle.submitted.result(timeout or 30.0)
        except MeshantError as e:
            raise click.ClickException(f"graph refused: [{e.code}] {e.message}") from None
        if not wait_:
            click.echo(json.dumps({"graph": handle.id}) if as_json else handle.id)
            return
        if not as_json:
            click.echo(handle.id, err=True)
        try:
            for u in handle.updates(timeout):
                if u.kind != "finished":
                    continue
                if as_json:
                    click.echo(json.dumps(_node_line(handle.id, u, handle)))
                elif u.error is not None:
                    kind = getattr(u.error, "remote_type", "")
                    click.echo(f"{u.node}: {u.state} [{u.error.code}] "
                               f"{kind + ': ' if kind else ''}{u.error.message}",
                               err=True)
                else:
                    click.echo(f"{u.node}: {json.dumps(jsonable(u.result))}")
        except TimeoutError:
            raise click.ClickException(f"no node of graph {handle.id} finished for "
                                       f"{timeout:g} s; it goes on (meshant graph status "
                                       f"{handle.id})") from None
        state = handle.state or "failed"
        end: dict[str, Any] = {"graph": handle.id, "state": state}
        try:
            handle.result(5.0)
        except MeshantError as e:
            failed = getattr(e, "failed", None)  # GraphFailed: graph.result's node
            if failed:
                end["failed"] = failed
            if not as_json:
                click.echo(f"graph {handle.id} {state}: {e.message}", err=True)
        if as_json:
            click.echo(json.dumps(end))
        if state != "completed":
            sys.exit(1)


@graph.command("status")
@client_options()
@click.argument("graph_id")
@JSON_OPT
def graph_status(conn: Connection, graph_id: str, as_json: bool) -> None:
    """Show a graph's state and every node's."""
    with conn.client() as client:
        try:
            st = client.graph_status(graph_id)
        except MeshantError as e:
            raise click.ClickException(f"[{e.code}] {e.message}") from None
    if as_json:
        click.echo(json.dumps(st, default=jsonable))
        return
    counts = ", ".join(f"{k}={v}" for k, v in sorted(st.get("counts", {}).items()))
    failed = f", failed at {st['failed']!r}" if st.get("failed") else ""
    click.echo(f"graph {st['graph']} {st['state']}{failed}: {st.get('nodes', 0)} nodes "
               f"({counts})")
    for n in st.get("node_states") or []:
        err = n.get("error") or {}
        kind = f"{err['type']}: " if err.get("type") else ""
        why = f"  [{err.get('code')}] {kind}{err.get('message', '')}" if err else ""
        tries = (f"attempt {n['attempt']}" if n.get("attempt")
                 else "attempt ?" if n.get("attempt", 0) is None else "not run")
        click.echo(f"  {n['node']:24} {n['state']:10} {n['capability']:14} {tries:10}{why}")


@graph.command("cancel")
@client_options()
@click.argument("graph_id")
def graph_cancel(conn: Connection, graph_id: str) -> None:
    """Cancel a graph: its pending nodes at once, its running ones best effort."""
    from meshant import protocol as p
    from meshant.cli.tasks import sent_cancel

    with conn.client() as client:
        try:
            client.graph_status(graph_id)  # a clear error for an unknown id
        except MeshantError as e:
            raise click.ClickException(f"[{e.code}] {e.message}") from None
        rec = sent_cancel(client, "graph", graph_id,
                          p.Message("graph.cancel", {"graph": graph_id}, to="queen"))
    if not rec["ok"]:
        raise click.ClickException(f"graph {graph_id} is {rec['state']}"
                                   + (f": {rec['note']}" if rec.get("note") else ""))
    click.echo(f"graph {graph_id}: {rec['state']}", err=True)


COMMANDS = [graph]
