"""The Celery app the peers comparison starts a worker for (needs celery and redis)."""

from __future__ import annotations

import os
from typing import Any

import celery

app = celery.Celery("peers", broker=os.environ.get("PEERS_REDIS"),
                    backend=os.environ.get("PEERS_REDIS"))


@app.task(name="peers.echo")
def echo(x: Any) -> Any:
    return x
