"""Carrying out what the queen core decided, in order: the one loop the queen actor and
the simulator's queen both run, whoever owns the sockets and the database.

Each run of consecutive journal actions is one transaction (``grouped``) and is durable
before anything after it leaves; a commit that fails (a deposed leader, a database away
past the lease) stops the rest of the turn: nothing that depended on it may go out. A
message that cannot be encoded is dropped (and said); a send the connection refuses (the
peer is gone, its pipe is full) is counted, never waited for.
"""

from __future__ import annotations

from typing import Protocol

from meshant import protocol as p
from meshant.core.queen.outbox import Action, Commit, Publish, Read, Send, grouped


class QueenPort(Protocol):
    """What a queen driver does for the core's actions."""

    def send(self, identity: bytes, frames: list[bytes], msg: p.Message) -> bool:
        """Send ``msg``, encoded as ``frames``, to the peer on ``identity``; False if it
        could not (gone, pipe full)."""

    def publish(self, topic: bytes, frames: list[bytes]) -> None: ...

    def read(self, read: Read) -> None:
        """Start the journal read (its answer comes back as ``QueenCore.fetched``)."""

    def commit(self, commit: Commit) -> bool:
        """Make the journal actions durable in one transaction; False if it failed and
        the turn must stop here."""

    def unencodable(self, msg: p.Message, error: p.ProtocolError) -> None:
        """``msg`` cannot be encoded for its peer (it is dropped)."""


def carry_out(actions: list[Action], port: QueenPort, counters: dict[str, int]) -> bool:
    """Carry ``actions`` out through ``port``, in order. False if a commit failed (what
    followed it was not carried out)."""
    encode_for = p.encode_for
    send = port.send
    for a in grouped(actions):
        # (isinstance in the order of how often each comes, not a match statement: its
        # class patterns cost a getattr per captured field, on every message sent)
        if isinstance(a, Send):
            msg = a.msg
            try:
                frames = encode_for(msg, a.codec)
            except p.ProtocolError as e:
                port.unencodable(msg, e)
                continue
            if not send(a.identity, frames, msg):
                counters["dropped_sends"] += 1
        elif isinstance(a, Commit):
            if not port.commit(a):
                return False
        elif isinstance(a, Publish):
            port.publish(a.topic, a.frames)
        elif isinstance(a, Read):
            port.read(a)
        else:
            raise TypeError(f"not an action of the queen core: {a!r}")
    return True


__all__ = ["QueenPort", "carry_out"]
