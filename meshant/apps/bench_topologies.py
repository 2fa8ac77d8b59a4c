"""The benchmark topologies: a colony (:class:`MeshTopology`) and the raw pyzmq floor on
the same placement (:class:`RawTopology`: a forwarding broker and echo workers, as
processes of :mod:`meshant.apps._rawzmq` for tcp/ipc, threads for inproc). The
scenarios that measure them are :mod:`meshant.apps.bench`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Any

import msgpack
import zmq

from meshant.actors.client import Client
from meshant.apps import _procs


class Endpoints:
    """Fresh endpoints of one transport (ipc ones in a temporary directory)."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self._tmp = tempfile.mkdtemp(prefix="meshant-bench-") if transport == "ipc" else None
        self._n = 0

    def fixed(self) -> str:
        """An endpoint known before anything binds it (tcp: a port free now)."""
        if self.transport != "tcp":
            return self.next()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"tcp://127.0.0.1:{s.getsockname()[1]}"

    def next(self) -> str:
        self._n += 1
        if self.transport == "tcp":
            return "tcp://127.0.0.1:0"
        if self.transport == "ipc":
            return f"ipc://{self._tmp}/ep{self._n}"
        return f"inproc://meshant-bench-{os.getpid()}-{id(self)}-{self._n}"

    def close(self) -> None:
        if self._tmp:
            for f in os.listdir(self._tmp):
                os.unlink(os.path.join(self._tmp, f))
            os.rmdir(self._tmp)


class MeshTopology:
    """A queen and ``n`` echo foragers; processes for tcp/ipc, threads for inproc."""

    def __init__(self, transport: str, foragers: int = 1, slots: int = 1,
                 journal: str | None = None, app: str | None = None) -> None:
        """``foragers=0``: just the queen; ``journal``: the queen journals to that file;
        ``app``: the foragers serve that ``--app`` (tcp/ipc) instead of the builtins."""
        self.transport = transport
        self.app = app
        self.eps = Endpoints(transport)
        self.procs: list[subprocess.Popen[str]] = []
        self.inproc: list[Any] = []
        self.ctx: zmq.Context[Any] | None = None
        if transport == "inproc":
            from meshant.actors.forager import Forager
            from meshant.actors.queen import Queen
            from meshant.apps.builtin import add_builtins

            self.ctx = zmq.Context()
            q = Queen(self.eps.next(), self.eps.next(), context=self.ctx).start()
            self.inproc.append(q)
            self.endpoint = q.endpoint
            for _ in range(foragers):
                f = Forager(self.endpoint, slots=slots, context=self.ctx)
                add_builtins(f, ["echo"])
                self.inproc.append(f.start())
        else:
            # The foragers start with the queen, not after it (each start is most of a
            # second of imports): on endpoints chosen now, or, should another process take
            # one meanwhile, one after the other on ports the system picks.
            bind, pub = self.eps.fixed(), self.eps.fixed()
            qp = _procs.spawn(["queen", "--bind", bind, "--pub", pub, "--json", "--journal",
                               journal or ":memory:"])
            fs = [self._forager(bind, slots, app) for _ in range(foragers)]
            try:
                self.endpoint = _procs.read_json_line(qp, 20)["router"]
            except RuntimeError:
                _procs.stop([qp, *fs])
                qp = _procs.spawn(["queen", "--bind", self.eps.next(), "--pub",
                                   self.eps.next(), "--json", "--journal", journal or ":memory:"])
                self.endpoint = _procs.read_json_line(qp, 20)["router"]
                fs = [self._forager(self.endpoint, slots, app) for _ in range(foragers)]
            self.procs += [qp, *fs]
            for fp in fs:
                _procs.read_json_line(fp, 20)

    @staticmethod
    def _forager(endpoint: str, slots: int, app: str | None = None) -> subprocess.Popen[str]:
        return _procs.spawn(["forager", "--queen", endpoint, "--slots", str(slots), "--json",
                             *(["--app", app] if app else [])])

    def client(self, threaded: bool = False) -> Client:
        return Client(self.endpoint, context=self.ctx, timeout=10, threaded=threaded)

    def close(self) -> None:
        for obj in reversed(self.inproc):
            obj.stop()
        _procs.stop(self.procs)
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
        self.eps.close()


class RawTopology:
    """The floor: a forwarding broker and ``n`` echo workers in raw pyzmq."""

    def __init__(self, transport: str, workers: int = 1, kind: str = "worker") -> None:
        """``kind``: ``worker`` (echo) or ``streamer`` (n messages per request; tcp/ipc)."""
        from meshant.apps import _rawzmq

        self.eps = Endpoints(transport)
        self.procs: list[subprocess.Popen[str]] = []
        self.threads: list[threading.Thread] = []
        self.ctx: zmq.Context[Any] = zmq.Context()
        env = {"PYTHONUNBUFFERED": "1"}
        if transport == "inproc":
            if kind != "worker":
                raise ValueError("the raw streamer runs as a process: use tcp or ipc")
            front, back = self.eps.next(), self.eps.next()
            self._stop = threading.Event()
            # Per instance: set by this topology's broker once it is bound (_bound) and has
            # heard READY from all its workers (_ready), so timing starts with every worker in.
            self._bound = threading.Event()
            self._ready = threading.Event()
            t = threading.Thread(target=self._broker_thread, args=(front, back, workers),
                                 daemon=True)
            t.start()
            self.threads.append(t)
            if not self._bound.wait(10):
                raise RuntimeError("the raw broker did not bind within 10 s")
            for _ in range(workers):
                w = threading.Thread(target=self._worker_thread, args=(back,), daemon=True)
                w.start()
                self.threads.append(w)
            if not self._ready.wait(10):
                raise RuntimeError("the raw workers did not register within 10 s")
            self.endpoint = front
            return
        def start(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen([sys.executable, "-m", "meshant.apps._rawzmq", *args],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, **env})

        # As the colony's: the workers start with the broker, on endpoints chosen now.
        front, back = self.eps.fixed(), self.eps.fixed()
        b = start("broker", front, back)
        ws = [start(kind, back) for _ in range(workers)]
        try:
            info = _procs.read_json_line(b, 20)
        except RuntimeError:
            _procs.stop([b, *ws])
            b = start("broker", self.eps.next(), self.eps.next())
            info = _procs.read_json_line(b, 20)
            ws = [start(kind, info["back"]) for _ in range(workers)]
        self.endpoint = info["front"]
        self.procs += [b, *ws]
        for wp in ws:
            _procs.read_json_line(wp, 20)
        _ = _rawzmq

    def _broker_thread(self, front_ep: str, back_ep: str, expected: int) -> None:
        front = self.ctx.socket(zmq.ROUTER)
        back = self.ctx.socket(zmq.ROUTER)
        front.bind(front_ep)
        back.bind(back_ep)
        self._bound.set()
        if expected == 0:
            self._ready.set()
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        workers: list[bytes] = []
        rr = 0
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(100))
                if back in events:
                    fr = back.recv_multipart()
                    if fr[1] == b"READY":
                        workers.append(fr[0])
                        if len(workers) == expected:
                            self._ready.set()
                    else:
                        front.send_multipart(fr[1:])
                if front in events and workers:
                    fr = front.recv_multipart()
                    rr = (rr + 1) % len(workers)
                    back.send_multipart([workers[rr], *fr])
        finally:
            front.close(0)
            back.close(0)

    def _worker_thread(self, back_ep: str) -> None:
        s = self.ctx.socket(zmq.DEALER)
        s.connect(back_ep)
        s.send(b"READY")
        try:
            while not self._stop.is_set():
                if s.poll(100):
                    fr = s.recv_multipart()
                    s.send_multipart([fr[0], msgpack.packb(msgpack.unpackb(fr[1]))])
        finally:
            s.close(0)

    def client(self) -> zmq.Socket[Any]:
        s: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        return s

    def close(self) -> None:
        if self.threads:
            self._stop.set()
            for t in self.threads:
                t.join(5)
        _procs.stop(self.procs)
        self.ctx.destroy(linger=0)
        self.eps.close()
