"""One configuration object per queen, listed once in the docs."""

from __future__ import annotations

import dataclasses

import pytest

from meshant import Client, ClientConfig, ConfigError, ForagerConfig, Queen, QueenConfig

from .config_table import DOC, render
from .conftest import Colony


def test_the_configuration_doc_is_the_config_object() -> None:
    assert DOC.read_text() == render(), "run: python -m tests.config_table"


def test_queen_takes_the_object_or_its_fields_and_refuses_unknown_settings() -> None:
    q = Queen("inproc://cfg-r", "inproc://cfg-p", config=QueenConfig(name="q1"), hb_misses=7)
    assert q.config.name == "q1" and q.config.hb_misses == 7
    assert q.pub_hwm == QueenConfig().pub_buffer // QueenConfig().max_broadcast
    with pytest.raises(ConfigError, match="QueenConfig"):
        Queen("inproc://cfg-r2", "inproc://cfg-p2", nonsense=1)
    assert all(f.name.isidentifier() for f in dataclasses.fields(QueenConfig))


def test_peers_take_their_config_object_or_its_fields(colony: Colony) -> None:
    colony.start_queen()
    f = colony.forager({"echo": lambda x: x}, config=ForagerConfig(name="cfg-f", slots=3))
    assert f.config.slots == 3 and f.slots == 3 and f.name == "cfg-f"
    c = colony.client(config=ClientConfig(name="cfg-c", queen_wait=9.0), wait=5.0)
    assert c.queen_wait == 9.0 and c.wait == 5.0 and c.name == "cfg-c"
    assert c.run("echo", 1, result_timeout=10) == 1
    with pytest.raises(ConfigError, match="ClientConfig"):
        Client(colony.endpoint, nonsense=1)
