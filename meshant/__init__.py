"""meshant — a ZeroMQ agent mesh: a queen, foragers and clients speaking IACP/2."""

from ._version import __version__
from .client import AsyncClient, Client, TaskFuture, Update
from .errors import (
    ConfigError,
    DeadlineExceeded,
    MeshantError,
    NoForager,
    QueenUnreachable,
    QueueFull,
    RateLimited,
    Refused,
    TaskCancelled,
    TaskFailed,
    TooLarge,
)
from .forager import Forager, TaskContext
from .protocol import Blob, Message, ProtocolError
from .queen import Queen

__all__ = [
    "AsyncClient",
    "Blob",
    "Client",
    "ConfigError",
    "DeadlineExceeded",
    "Forager",
    "MeshantError",
    "Message",
    "NoForager",
    "ProtocolError",
    "Queen",
    "QueenUnreachable",
    "QueueFull",
    "RateLimited",
    "Refused",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskFuture",
    "TooLarge",
    "Update",
    "__version__",
]
