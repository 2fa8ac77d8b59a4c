"""``meshant forager --app``: the app's Forager runs as its module built it, and the command
line changes only the settings it names (issue #24, item 1). Subprocesses, as a user runs
them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from meshant import Client

from .conftest import Procs, wait_for
from .test_cli import meshant

pytestmark = pytest.mark.slow

APP = '''
import json, os
from meshant import Forager

forager = Forager(os.environ["APP_QUEEN"], name="appf", slots=3, labels={"gpu": "no"})
OUT = os.environ["APP_OUT"]

def _log(rec):
    with open(OUT, "a") as fh:
        fh.write(json.dumps(rec) + "\\n")

@forager.task("shout")
def shout(p):
    return p.upper()

@forager.task("total", batch=4)
def total(ps):
    return [sum(p) for p in ps]

@forager.task("fast", inline=True)
def fast(p):
    return ["fast", p]

@forager.task("later")
async def later(p):
    return ["async", p]

@forager.on("news.")
def heard(topic, data):
    _log({"broadcast": topic, "data": data})

@forager.on_message
def message(msg):
    _log({"message": msg.b})
'''


def _start(procs: Procs, tmp_path: Path, ep: str, *extra: str,
           env: dict[str, str] | None = None) -> dict[str, Any]:
    (tmp_path / "settingsapp.py").write_text(APP)
    base = {k: v for k, v in os.environ.items() if k not in ("MESHANT_QUEEN", "MESHANT_SLOTS")}
    _, info = procs.start("forager", "--app", "settingsapp:forager", "--json", *extra,
                          env={**base, **(env or {}), "APP_QUEEN": ep,
                               "APP_OUT": str(tmp_path / "heard.jsonl"),
                               "PYTHONPATH": str(tmp_path)})
    return info


def _forager(ep: str, name: str) -> dict[str, Any]:
    r = meshant("status", "--queen", ep, "--json")
    assert r.returncode == 0, r.stderr
    (f,) = [f for f in json.loads(r.stdout)["foragers"] if f["name"] == name]
    return f  # type: ignore[no-any-return]


def _heard(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "heard.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_app_forager_keeps_its_settings_and_callbacks(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen()
    info = _start(procs, tmp_path, ep)
    assert info["name"] == "appf" and info["slots"] == 3 and info["queen"] == ep
    assert info["tools"] == ["fast", "later", "shout", "total"]
    f = _forager(ep, "appf")
    assert f["slots"] == 3 and f["labels"] == {"gpu": "no"}
    # A submission requiring the app's label runs at once (it waited 30 s for no-forager).
    r = meshant("submit", "--queen", ep, "-l", "gpu=no", "--wait", "5", "shout", '"hi"')
    assert r.returncode == 0 and json.loads(r.stdout) == "HI", r.stderr
    for cap, payload, want in (("total", "[1, 2, 3]", 6), ("fast", "1", ["fast", 1]),
                               ("later", '"x"', ["async", "x"])):
        r = meshant("submit", "--queen", ep, cap, payload)
        assert r.returncode == 0 and json.loads(r.stdout) == want, (cap, r.stderr)
    # Its broadcast handler hears `meshant broadcast`; its message callback a directed one.
    r = meshant("broadcast", "--queen", ep, "news.today", '{"headline": "ants"}')
    assert r.returncode == 0, r.stderr
    wait_for(lambda: {"broadcast": "news.today", "data": {"headline": "ants"}}
             in _heard(tmp_path), what="the app's @forager.on handler")
    r = meshant("broadcast", "--queen", ep, "sports.today", "1")
    with Client(ep) as c:
        c.send("appf", {"hello": "appf"})
        wait_for(lambda: {"message": {"hello": "appf"}} in _heard(tmp_path),
                 what="the app's on_message callback")
    assert not any(h.get("broadcast") == "sports.today" for h in _heard(tmp_path))


def test_command_line_overrides_only_what_it_names(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen()
    info = _start(procs, tmp_path, ep, "--name", "renamed", "--label", "zone=eu")
    assert info["name"] == "renamed" and info["slots"] == 3  # --slots not given: the app's
    f = _forager(ep, "renamed")
    assert f["labels"] == {"gpu": "no", "zone": "eu"}
    info = _start(procs, tmp_path, ep, "--slots", "2", "--name", "two")
    assert info["slots"] == 2 and _forager(ep, "two")["labels"] == {"gpu": "no"}
    info = _start(procs, tmp_path, ep, "--name", "env-slots", env={"MESHANT_SLOTS": "5"})
    assert info["slots"] == 5


def test_command_line_queen_overrides_the_apps(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen()
    _, other = procs.queen()
    (tmp_path / "settingsapp.py").write_text(APP)
    info = _start(procs, tmp_path, ep, "--queen", other)
    assert info["queen"] == other and info["name"] == "appf"
    assert _forager(other, "appf")["slots"] == 3
