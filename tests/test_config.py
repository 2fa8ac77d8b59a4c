"""One configuration object per queen, listed once in the docs."""

from __future__ import annotations

import dataclasses

import pytest

from meshant import Queen, QueenConfig

from .config_table import DOC, render


def test_the_configuration_doc_is_the_config_object() -> None:
    assert DOC.read_text() == render(), "run: python -m tests.config_table"


def test_queen_takes_the_object_or_its_fields_and_refuses_unknown_settings() -> None:
    q = Queen("inproc://cfg-r", "inproc://cfg-p", config=QueenConfig(name="q1"), hb_misses=7)
    assert q.config.name == "q1" and q.config.hb_misses == 7
    assert q.pub_hwm == QueenConfig().pub_buffer // QueenConfig().max_broadcast
    with pytest.raises(TypeError, match="QueenConfig"):
        Queen("inproc://cfg-r2", "inproc://cfg-p2", nonsense=1)
    assert all(f.name.isidentifier() for f in dataclasses.fields(QueenConfig))
