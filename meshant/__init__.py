"""meshant — a ZeroMQ agent mesh: a queen, foragers and clients speaking IACP/2."""

from meshant._version import __version__
from meshant.actors.async_client import AsyncClient
from meshant.actors.attach import Attachment
from meshant.actors.capability import Capability
from meshant.actors.client import Client, SubmitOptions
from meshant.actors.config import ClientConfig, ForagerConfig
from meshant.actors.forager import Forager
from meshant.actors.futures import TaskFuture, Update
from meshant.actors.graphs import Graph, GraphHandle, GraphUpdate
from meshant.actors.handlers import TaskContext
from meshant.actors.queen import Queen
from meshant.conformance import check_forager, check_queen
from meshant.core.queen.router import QueenConfig
from meshant.errors import (
    AskTimeout,
    ConfigError,
    DeadlineExceeded,
    Forbidden,
    GraphFailed,
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
from meshant.protocol import Blob, Message, ProtocolError

__all__ = [
    "AskTimeout",
    "AsyncClient",
    "Attachment",
    "Blob",
    "Capability",
    "Client",
    "ClientConfig",
    "ConfigError",
    "DeadlineExceeded",
    "Forager",
    "ForagerConfig",
    "Forbidden",
    "Graph",
    "GraphFailed",
    "GraphHandle",
    "GraphUpdate",
    "MeshantError",
    "Message",
    "NoForager",
    "ProtocolError",
    "Queen",
    "QueenConfig",
    "QueenUnreachable",
    "QueueFull",
    "RateLimited",
    "Refused",
    "SubmitOptions",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskFuture",
    "TooLarge",
    "Update",
    "__version__",
    "check_forager",
    "check_queen",
]
