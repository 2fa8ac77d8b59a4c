"""The settings of a forager and of a client, each one object (as ``QueenConfig`` is the
queen's): ``Forager(queen, config=ForagerConfig(...))`` or keyword arguments of the same
names. docs/configuration.md lists them (kept equal to these classes by a test)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from meshant.errors import ConfigError

C = TypeVar("C")


def _doc(text: str) -> Any:
    return {"doc": text}


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """What foragers and clients share: their name, and how they find and trust the
    queen."""

    name: str | None = field(default=None, metadata=_doc(
        "Its name (default ROLE-HOST-PID-RAND); a restarted peer may take it back."))
    colony: str | None = field(default=None, metadata=_doc(
        "The colony to find by discovery (`MESHANT_COLONY`)."))
    discover: bool | None = field(default=None, metadata=_doc(
        "Find the queen by mDNS (default: when no endpoint and no `MESHANT_QUEEN`)."))
    curve_secret: str | None = field(default=None, metadata=_doc(
        "Its CURVE key pair file (`MESHANT_CURVE_SECRET`)."))
    queen_key: str | None = field(default=None, metadata=_doc(
        "The queen's CURVE public key file (`MESHANT_QUEEN_KEY`)."))
    follow_leader: bool = field(default=True, metadata=_doc(
        "Follow a standby queen's `not-leader` hint to the leader; False: that answer is "
        "a `Refused` (code `not-leader`, the standby's role, term and leader in `.detail`)."))


@dataclass(frozen=True, slots=True)
class ForagerConfig(PeerConfig):
    """A forager's settings."""

    slots: int = field(default=1, metadata=_doc("Tasks it runs at once."))
    labels: dict[str, Any] | None = field(default=None, metadata=_doc(
        "Labels tasks may require (`labels=` on submit)."))


@dataclass(frozen=True, slots=True)
class ClientConfig(PeerConfig):
    """A client's settings."""

    timeout: float = field(default=10.0, metadata=_doc(
        "Seconds to wait for the queen's welcome (else QueenUnreachable)."))
    wait: float | None = field(default=None, metadata=_doc(
        "Default seconds a task waits for a forager offering its capability."))
    threaded: bool = field(default=True, metadata=_doc(
        "An I/O thread of its own; False: the caller's thread drives the socket."))
    queen_wait: float = field(default=30.0, metadata=_doc(
        "Seconds the queen may stay away before pending tasks fail QueenUnreachable."))
    submit_timeout: float = field(default=60.0, metadata=_doc(
        "Seconds a submission is re-sent while the queen answers rate-limited."))
    retry_queue_full: bool = field(default=False, metadata=_doc(
        "Also re-send submissions refused queue-full, within submit_timeout."))
    max_pending_bytes: int = field(default=256 * 1024 * 1024, metadata=_doc(
        "Bytes of unfinished submissions kept for re-sending; beyond, submit raises "
        "QueueFull."))


def settle(kind: type[C], config: C | None, settings: dict[str, Any]) -> C:
    """``config`` (or the defaults) with ``settings`` applied; a ConfigError names the
    setting that does not exist."""
    try:
        return dataclasses.replace(config or kind(), **settings)  # type: ignore[type-var]
    except TypeError as e:
        raise ConfigError(f"{e} (the settings are {kind.__name__}'s fields)") from None


__all__ = ["ClientConfig", "ForagerConfig", "PeerConfig", "settle"]
