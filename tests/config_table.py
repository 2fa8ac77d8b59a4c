"""Render docs/configuration.md from QueenConfig and the queen command's options (run it
after adding a setting; tests/test_config.py fails until you do)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from meshant.actors.config import ClientConfig, ForagerConfig
from meshant.cli.queen import queen
from meshant.core.queen.router import QueenConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

HEAD = """# Configuration

Every setting of a queen is a field of one object, `meshant.QueenConfig`: the CLI builds it
from its options, and `Queen(bind, pub, config=QueenConfig(...))` — or `Queen(bind, pub,
name=..., ...)` with keyword arguments of the same names — takes it. This table is that
object, field by field (`tests/test_config.py` keeps it equal to the code; rewrite it with
`python -m tests.config_table`). The endpoints (`--bind`, `--pub`, default
`tcp://127.0.0.1:5670` and `:5671`, `MESHANT_BIND`/`MESHANT_PUB`) are the `Queen`'s own
arguments. The API's `journal` default is none (a volatile queen); the CLI's is the file
`meshant-queen.db`.

| field | default | CLI option | meaning |
|---|---|---|---|
"""

PEERS = """
## Foragers and clients

`Forager(queen, config=ForagerConfig(...))` and `Client(queen, config=ClientConfig(...))`
— or keyword arguments of the same names — take their settings the same way; the CLI
builds them from its options (`meshant forager`, and every command that connects as a
client). `Client` also takes `on_progress=` (a callback) and both take `context=` (a
ZeroMQ context): objects, not settings. `MESHANT_QUEEN` is the endpoint's default.
"""


def _peer_table(kind: type) -> str:
    rows = [f"| `{f.name}` | `{f.default!r}` | {f.metadata['doc']} |"
            for f in dataclasses.fields(kind)]
    return (f"\n### `{kind.__name__}`\n\n| field | default | meaning |\n|---|---|---|\n"
            + "\n".join(rows) + "\n")


def render() -> str:
    opts = {prm.name: prm for prm in queen.params}
    rows = []
    for f in dataclasses.fields(QueenConfig):
        o = opts[f.name]  # every setting has its option
        flag = "/".join(o.opts) + (" / " + "/".join(o.secondary_opts)
                                   if o.secondary_opts else "")
        env = f" (`{o.envvar}`)" if o.envvar else ""
        help_ = (o.help or "").replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{f.default!r}` | `{flag}`{env} | {help_} |")
    return (HEAD + "\n".join(rows) + "\n" + PEERS + _peer_table(ForagerConfig)
            + _peer_table(ClientConfig))


if __name__ == "__main__":
    DOC.write_text(render())
