"""The benchmark suite: meshant against raw pyzmq on the same topology, in the same run.

Each scenario runs the colony (queen and foragers as processes, or threads for inproc)
and the raw pyzmq floor (broker and worker, same placement), then reports both figures
and their ratio. Used by ``meshant bench`` and ``benchmarks/roundtrip.py``. The
topologies themselves are :mod:`meshant.apps.bench_topologies`.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

from meshant.actors.client import Client
from meshant.apps import _procs
from meshant.apps.bench_topologies import MeshTopology, RawTopology
from meshant.apps.stats import summary


@dataclass
class Sizes:
    seq: int = 3000
    warmup: int = 300
    pipelined: int = 20000
    window: int = 64
    brief: bool = False  # the few-second run: fewer variants of the slow scenarios

    @classmethod
    def quick(cls) -> Sizes:
        """``bench --quick``: enough samples for a p99, a run of seconds, not a minute."""
        return cls(seq=200, warmup=20, pipelined=900, window=32, brief=True)


# The scenarios `bench --quick` runs unless told which: one of each kind of figure but the
# journal's (`-s journal` adds it). Starting colonies is most of a quick run's time, so
# there the round trip and the pipelined scenario share one (and its raw twin).
QUICK = ("roundtrip", "pipelined", "inproc", "broadcast-10")


@dataclass
class Row:
    scenario: str
    metric: str
    unit: str
    meshant: float
    raw: float | None
    higher_is_better: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """meshant's cost relative to raw: >1 means meshant is slower (None: no raw twin)."""
        if self.raw is None:
            return None
        if self.higher_is_better:
            return self.raw / self.meshant if self.meshant else float("inf")
        return self.meshant / self.raw if self.raw else float("inf")

    def as_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {"scenario": self.scenario, "metric": self.metric, "unit": self.unit,
                "meshant": round(self.meshant, 3),
                "raw": None if self.raw is None else round(self.raw, 3),
                "ratio": None if ratio is None else round(ratio, 3), **self.extra}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "msgpack": ".".join(map(str, msgpack.version)), "platform": platform.platform()}


# -- measurements --------------------------------------------------------------------------

def seq_mesh(c: Client, payload: Any, n: int, warmup: int,
             capability: str = "echo") -> list[float]:
    for _ in range(warmup):
        c.submit(capability, payload).result(30)
    out = []
    pc = time.perf_counter
    for _ in range(n):
        t0 = pc()
        c.submit(capability, payload).result(30)
        out.append(pc() - t0)
    return out


def seq_raw(s: zmq.Socket[Any], payload: Any, n: int, warmup: int) -> list[float]:
    packb, unpackb = msgpack.packb, msgpack.unpackb
    for _ in range(warmup):
        s.send(packb(payload))
        unpackb(s.recv())
    out = []
    pc = time.perf_counter
    for _ in range(n):
        t0 = pc()
        s.send(packb(payload))
        unpackb(s.recv())
        out.append(pc() - t0)
    return out


def pipelined_mesh(c: Client, payload: Any, n: int, window: int,
                   capability: str = "echo") -> float:
    sem = threading.Semaphore(window)
    done = threading.Event()
    left = [n]
    lock = threading.Lock()

    def finished(_f: Any) -> None:
        sem.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    t0 = time.perf_counter()
    for _ in range(n):
        sem.acquire()
        c.submit(capability, payload).add_done_callback(finished)
    if not done.wait(120):
        raise RuntimeError("pipelined benchmark did not finish within 120 s")
    return n / (time.perf_counter() - t0)


def pipelined_raw(s: zmq.Socket[Any], payload: Any, n: int, window: int) -> float:
    packb, unpackb = msgpack.packb, msgpack.unpackb
    t0 = time.perf_counter()
    sent = 0
    for _ in range(min(window, n)):
        s.send(packb(payload))
        sent += 1
    for _ in range(n):
        unpackb(s.recv())
        if sent < n:
            s.send(packb(payload))
            sent += 1
    return n / (time.perf_counter() - t0)


PAYLOAD = {"task": "echo", "n": 1, "text": "x" * 64}


# While a --quick suite runs: the colonies (and raw twins) it started, by what they are,
# for the next scenario that wants the same; stopped when the suite ends.
_shared: dict[str, tuple[MeshTopology, RawTopology]] | None = None


def _both(transport: str, mesh: dict[str, Any], workers: int) -> tuple[MeshTopology,
                                                                        RawTopology]:
    """A colony and its raw pyzmq twin, started side by side: starting processes is most
    of a short scenario's time."""
    key = repr((transport, sorted(mesh.items()), workers))
    if _shared is not None and key in _shared:
        return _shared[key]
    pair = _start_both(transport, mesh, workers)
    if _shared is not None:
        _shared[key] = pair
    return pair


def _start_both(transport: str, mesh: dict[str, Any],
                workers: int) -> tuple[MeshTopology, RawTopology]:
    if transport == "inproc":
        return MeshTopology(transport, **mesh), RawTopology(transport, workers=workers)
    with ThreadPoolExecutor(2) as ex:  # leaving it waits for both
        m = ex.submit(MeshTopology, transport, **mesh)
        r = ex.submit(RawTopology, transport, workers=workers)
    error = m.exception() or r.exception()
    if error is not None:
        if m.exception() is None:
            m.result().close()
        if r.exception() is None:
            r.result().close()
        raise error
    return m.result(), r.result()


def _close(*topologies: MeshTopology | RawTopology) -> None:
    """Stop them side by side (each waits for its processes to exit); shared ones are
    stopped when the suite ends."""
    if _shared is not None and any(t in pair for pair in _shared.values()
                                   for t in topologies):
        return
    with ThreadPoolExecutor(len(topologies)) as ex:
        for f in [ex.submit(t.close) for t in topologies]:
            f.result()


def run_roundtrip(transport: str, sizes: Sizes, payload: Any = PAYLOAD,
                  label: str = "", rounds: int = 10, threaded: bool = False,
                  journal: str | None = None) -> list[Row]:
    """Sequential round trip percentiles, one forager/worker.

    Both topologies run side by side and take turns in ``rounds`` slices, so drifts in
    machine load fall on both alike.
    """
    # One task at a time uses one slot whatever the forager has: --quick gives it the
    # pipelined scenario's, to share that colony.
    slots = sizes.window if sizes.brief else 1
    mesh, raw = _both(transport, {"foragers": 1, "slots": slots, "journal": journal}, 1)
    try:
        with mesh.client(threaded) as c:
            s = raw.client()
            try:
                m_s: list[float] = []
                r_s: list[float] = []
                per = max(1, sizes.seq // rounds)
                for i in range(rounds):
                    warm = sizes.warmup if i == 0 else 5
                    m_s += seq_mesh(c, payload, per, warm)
                    r_s += seq_raw(s, payload, per, warm)
            finally:
                s.close(0)
    finally:
        _close(mesh, raw)
    m = summary([x * 1e6 for x in m_s])
    r = summary([x * 1e6 for x in r_s])
    name = f"round trip, {transport}{label}"
    return [Row(name, k, "us", m[k], r[k], extra={"samples": m["n"]})
            for k in ("p50", "p90", "p99", "p99.9", "max")]


def run_pipelined(transport: str, sizes: Sizes, foragers: int = 1, rounds: int = 3,
                  journal: str | None = None, label: str = "") -> list[Row]:
    """Throughput with ``window`` tasks in flight; the best of ``rounds`` alternating runs."""
    mesh, raw = _both(transport, {"foragers": foragers, "journal": journal,
                                  "slots": max(1, sizes.window // foragers)}, foragers)
    try:
        with mesh.client(threaded=True) as c:
            s = raw.client()
            try:
                pipelined_mesh(c, PAYLOAD, sizes.window * 4, sizes.window)  # warm-up
                pipelined_raw(s, PAYLOAD, sizes.window * 4, sizes.window)
                n = max(sizes.window, sizes.pipelined // rounds)
                m = r = 0.0
                for _ in range(rounds):
                    m = max(m, pipelined_mesh(c, PAYLOAD, n, sizes.window))
                    r = max(r, pipelined_raw(s, PAYLOAD, n, sizes.window))
            finally:
                s.close(0)
    finally:
        _close(mesh, raw)
    return [Row(f"pipelined, {transport}, {foragers} forager(s), window {sizes.window}{label}",
                "throughput", "tasks/s", m, r, higher_is_better=True)]


def run_journal(sizes: Sizes) -> list[Row]:
    """Round trip and throughput with the journal off, on a file (SQLite), and on
    PostgreSQL when ``MESHANT_BENCH_POSTGRES`` names a database (``--postgres URL``)."""
    rows = []
    pg = os.environ.get("MESHANT_BENCH_POSTGRES")
    durability = os.environ.get("MESHANT_DURABILITY")
    with tempfile.TemporaryDirectory(prefix="meshant-journal-") as d:
        # --quick: the SQLite journal's round trip (the roundtrip scenario has it off).
        for part in ("a",) if sizes.brief else ("a", "b"):
            kinds: list[tuple[str, str | None]] = [(", journal SQLite", f"{d}/{part}.db")]
            if not sizes.brief:
                kinds = [(", journal off", None), *kinds,
                         (", journal SQLite, power", f"{d}/{part}p.db")]
            if pg:
                kinds.append((", journal PostgreSQL", pg))
            for label, path in kinds:
                # --durability power (an fsync per commit) for that row only.
                os.environ["MESHANT_DURABILITY"] = "power" if "power" in label else "process"
                if part == "a":
                    rows += [r for r in run_roundtrip("tcp", sizes, label=label, journal=path)
                             if r.metric in ("p50", "p99", "p99.9")]
                else:
                    rows += run_pipelined("tcp", sizes, 1, journal=path, label=label)
    if durability is None:
        os.environ.pop("MESHANT_DURABILITY", None)
    else:
        os.environ["MESHANT_DURABILITY"] = durability
    return rows


def run_steps(sizes: Sizes, steps: int = 10) -> list[Row]:
    """Durable steps' cost (#31): a task making ``steps`` trivial ``ctx.step`` calls
    beside a plain one, on one colony with a SQLite journal (where the records go), in
    interleaved rounds; raw pyzmq's echo on the same hops is the floor of both."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="meshant-steps-") as d:
        mesh = MeshTopology("tcp", 1, slots=sizes.window, journal=f"{d}/q.db",
                            app="meshant.apps.bench_steps:forager")
        raw = RawTopology("tcp", 1)
        try:
            with mesh.client(threaded=True) as c:
                s = raw.client()
                try:
                    plain: list[float] = []
                    stepped: list[float] = []
                    r_s: list[float] = []
                    rounds = 6
                    per = max(1, sizes.seq // rounds // 2)
                    for i in range(rounds):
                        warm = sizes.warmup // 2 if i == 0 else 3
                        plain += seq_mesh(c, PAYLOAD, per, warm)
                        stepped += seq_mesh(c, {"steps": steps}, per, warm, "steps")
                        r_s += seq_raw(s, PAYLOAD, per, warm)
                    n = max(sizes.window, sizes.pipelined // 4)
                    tp_plain = pipelined_mesh(c, PAYLOAD, n, sizes.window)
                    tp_steps = pipelined_mesh(c, {"steps": steps}, n, sizes.window, "steps")
                    tp_raw = pipelined_raw(s, PAYLOAD, n, sizes.window)
                finally:
                    s.close(0)
        finally:
            _close(mesh, raw)
    r = summary([x * 1e6 for x in r_s])
    m_plain = summary([x * 1e6 for x in plain])
    m_steps = summary([x * 1e6 for x in stepped])
    per_step = (m_steps["p50"] - m_plain["p50"]) / steps
    for label, m in ((", plain task", m_plain), (f", {steps} durable steps", m_steps)):
        rows += [Row(f"round trip, journal SQLite{label}", k, "us", m[k], r[k],
                     extra={"samples": m["n"]}) for k in ("p50", "p99")]
    rows.append(Row(f"a durable step (p50 difference / {steps})", "step", "us", per_step,
                    None))
    rows += [Row(f"pipelined, journal SQLite{label}", "throughput", "tasks/s", tp, tp_raw,
                 higher_is_better=True)
             for label, tp in ((", plain task", tp_plain), (f", {steps} durable steps",
                                                              tp_steps))]
    return rows


def _fanout_once(pub_send: Callable[[int], None], subs: list[zmq.Socket[Any]],
                 poller: zmq.Poller, n: int) -> float:
    """Publish once; seconds until the last of ``subs`` has it."""
    pending = set(range(len(subs)))
    index = {s: i for i, s in enumerate(subs)}
    t0 = time.perf_counter()
    pub_send(n)
    deadline = t0 + 10
    while pending:
        if time.perf_counter() > deadline:
            raise RuntimeError("broadcast did not reach every subscriber within 10 s")
        for sock, _ in poller.poll(1000):
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                sock.recv_multipart()
                pending.discard(index[sock])
    return time.perf_counter() - t0


def _subscribers(ctx: zmq.Context[Any], endpoint: str, topic: bytes,
                 n: int) -> tuple[list[zmq.Socket[Any]], zmq.Poller]:
    subs = []
    poller = zmq.Poller()
    for _ in range(n):
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, topic)
        s.connect(endpoint)
        poller.register(s, zmq.POLLIN)
        subs.append(s)
    return subs, poller


def _wait_subscribed(send: Callable[[int], None], subs: list[zmq.Socket[Any]],
                     poller: zmq.Poller) -> None:
    # Subscriptions travel to the PUB asynchronously: publish until every SUB hears one.
    deadline = time.monotonic() + 10
    heard: set[int] = set()
    index = {s: i for i, s in enumerate(subs)}
    while len(heard) < len(subs):
        if time.monotonic() > deadline:
            raise RuntimeError("subscribers did not connect within 10 s")
        send(-1)
        for sock, _ in poller.poll(50):
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                sock.recv_multipart()
                heard.add(index[sock])
    time.sleep(0.05)
    for s in subs:
        while s.poll(0):
            s.recv_multipart()


def run_fanout(sizes: Sizes, n_subs: int) -> list[Row]:
    """Broadcast latency: publish → the last of ``n_subs`` subscribers has it.

    meshant: a client's broadcast → the queen → its PUB; raw: a DEALER → a forwarding
    broker → its PUB. The subscribers are the same plain SUB sockets in both cases, so the
    figure is the mesh's cost, not the subscribers'.
    """
    rounds = max(20, sizes.seq // 10)
    ctx: zmq.Context[Any] = zmq.Context()
    # The raw broker starts while the queen does.
    raw_b = subprocess.Popen([sys.executable, "-m", "meshant.apps._rawzmq", "pubbroker",
                              "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mesh = MeshTopology("tcp", foragers=0)
    except BaseException:
        _procs.stop([raw_b])
        raise
    try:
        info = _procs.read_json_line(raw_b, 20)
        client = mesh.client()
        pub_ep = client.welcome["pub"]
        m_subs, m_poll = _subscribers(ctx, pub_ep, b"u.bench", n_subs)
        r_subs, r_poll = _subscribers(ctx, info["pub"], b"u.bench", n_subs)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(info["front"])

        def m_send(i: int) -> None:
            client.broadcast("bench", {"i": i})

        def r_send(i: int) -> None:
            dealer.send(msgpack.packb({"topic": "bench", "data": {"i": i}}))

        _wait_subscribed(m_send, m_subs, m_poll)
        _wait_subscribed(r_send, r_subs, r_poll)
        m_t, r_t = [], []
        for i in range(rounds):
            m_t.append(_fanout_once(m_send, m_subs, m_poll, i) * 1e6)
            r_t.append(_fanout_once(r_send, r_subs, r_poll, i) * 1e6)
        client.close()
    finally:
        mesh.close()
        _procs.stop([raw_b])
        ctx.destroy(linger=0)
    m, r = summary(m_t), summary(r_t)
    return [Row(f"broadcast fan-out to {n_subs} subscriber(s)", k, "us", m[k], r[k])
            for k in ("p50", "p99")]


def forager_swarm(endpoint: str, n: int, prefix: str) -> None:
    """``n`` real, idle :class:`Forager` objects in this process (one trivial handler,
    default settings: each with its own I/O thread, sockets, heartbeats and SUB), as the
    heartbeats scenario's helper: prints a JSON ready line once all are welcomed."""
    import json
    import signal

    from meshant.actors.forager import Forager

    foragers = []
    for i in range(n):
        f = Forager(endpoint, name=f"{prefix}-{i}", discover=False)
        f.add_handler("echo", lambda x: x)
        f.start(timeout=None)
        foragers.append(f)
    deadline = time.monotonic() + 120
    while not all(f.connected for f in foragers):
        if time.monotonic() > deadline:
            sys.exit(f"{prefix}: not all {n} foragers were welcomed")
        time.sleep(0.1)
    print(json.dumps({"event": "ready", "foragers": n}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        time.sleep(3600)


def run_heartbeat_cost(sizes: Sizes, peers: tuple[int, ...] | None = None) -> list[Row]:
    """The queen's CPU (all its threads, libzmq's I/O thread included) while many idle
    real foragers heartbeat: :class:`Forager` objects, up to 250 per helper process, so
    the queen sees exactly what real ones send (hb bodies, ZMTP pings, their SUBs)."""
    rows = []
    peers = peers or ((100,) if sizes.brief else (100, 1000))
    seconds = 1.0 if sizes.brief else 5.0
    per_proc = 250
    for n in peers:
        q = _procs.spawn(["queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                          "--json", "--hb-interval", "1.0", "--journal", ":memory:"])
        swarm: list[subprocess.Popen[str]] = []
        try:
            ep = _procs.read_json_line(q, 20)["router"]
            for k in range(0, n, per_proc):
                swarm.append(subprocess.Popen(
                    [sys.executable, "-c", "import sys; from meshant.apps.bench import "
                     "forager_swarm as f; f(sys.argv[1], int(sys.argv[2]), sys.argv[3])",
                     ep, str(min(per_proc, n - k)), f"hb{k // per_proc}"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"}))
            for proc in swarm:
                _procs.read_json_line(proc, 180)
            time.sleep(0.5 if sizes.brief else 2.0)  # past the joining burst
            c0 = _cpu_seconds(q.pid)
            time.sleep(seconds)
            used = _cpu_seconds(q.pid) - c0
        finally:
            _procs.stop(swarm)
            _procs.stop([q])
        rows.append(Row(f"heartbeats: {n} idle foragers, 1 s interval", "queen CPU", "%",
                        used / seconds * 100, None,
                        extra={"cpu_us_per_heartbeat": round(used / seconds / n * 1e6, 1),
                               "foragers": "real Forager objects, "
                                           f"{len(swarm)} process(es)"}))
    return rows


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_streaming(sizes: Sizes, progress: bool) -> list[Row]:
    """10 tasks streaming partial results to 10 clients through one queen, against the
    raw relay's messages per second (``meshant.apps.bench_streaming``)."""
    from meshant.apps.bench_streaming import round_once

    tasks, partials = 10, (300 if sizes.brief else 2000)
    m, r = round_once(tasks, partials, progress)
    label = ", with a progress report after each" if progress else ""
    return [Row(f"streaming: {tasks} tasks x {partials} partials to {tasks} clients{label}",
                "rate", "partials/s", m, r, higher_is_better=True,
                extra={"target": "meshant >= 2x raw (ratio <= 0.50x)"})]


Scenario = Callable[[Sizes], list[Row]]

SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "roundtrip": ("sequential round trip over tcp, direct client, trivial echo",
                  lambda z: run_roundtrip("tcp", z)),
    "roundtrip-threaded": ("the same with the default threaded client",
                           lambda z: run_roundtrip("tcp", z, threaded=True,
                                                   label=", threaded client")),
    "pipelined": ("pipelined throughput, window of tasks in flight, 1 forager",
                  lambda z: run_pipelined("tcp", z, 1)),
    "streaming": ("10 tasks streaming partial results to 10 clients (raw: a message each)",
                  lambda z: run_streaming(z, False)),
    "streaming-progress": ("the same with a progress report after each partial",
                           lambda z: run_streaming(z, True)),
    "pipelined-4": ("pipelined throughput, 4 foragers", lambda z: run_pipelined("tcp", z, 4)),
    "payload-100B": ("round trip of a 100 B bytes payload (inline msgpack bin)",
                     lambda z: run_roundtrip("tcp", _fewer(z), b"x" * 100, ", 100 B bytes")),
    "payload-10KB": ("round trip of a 10 KB bytes payload",
                     lambda z: run_roundtrip("tcp", _fewer(z), b"x" * 10_000, ", 10 KB bytes")),
    "payload-1MB": ("round trip of a 1 MB bytes payload",
                    lambda z: run_roundtrip("tcp", _fewer(z, 10), b"x" * 1_000_000,
                                            ", 1 MB bytes (blob frame)")),
    "ipc": ("sequential round trip over ipc://", lambda z: run_roundtrip("ipc", z)),
    "inproc": ("sequential round trip over inproc://, everything in one process",
               lambda z: run_roundtrip("inproc", z)),
    "broadcast-1": ("broadcast fan-out latency to 1 subscriber", lambda z: run_fanout(z, 1)),
    "broadcast-10": ("broadcast fan-out latency to 10 subscribers",
                     lambda z: run_fanout(z, 10)),
    "broadcast-50": ("broadcast fan-out latency to 50 subscribers",
                     lambda z: run_fanout(z, 50)),
    "heartbeats": ("the queen's CPU with 100 and 1000 idle real foragers heartbeating",
                   run_heartbeat_cost),
    "journal": ("round trip and throughput with the queen's journal off, on SQLite, and on "
                "PostgreSQL (with --postgres URL)",
                run_journal),
    "steps": ("a task of 10 durable steps beside a plain one, SQLite journal: round trip, "
              "a step's cost, pipelined throughput", run_steps),
}


def _fewer(z: Sizes, factor: int = 3) -> Sizes:
    return Sizes(seq=max(30, z.seq // factor), warmup=max(5, z.warmup // factor), brief=z.brief,
                 pipelined=z.pipelined, window=z.window)


def run_suite(names: list[str], sizes: Sizes,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the named scenarios; returns the machine, the rows and the wall time."""
    global _shared
    t0 = time.monotonic()
    rows: list[Row] = []
    _shared = {} if sizes.brief else None
    try:
        for name in names:
            if progress is not None:
                progress(name)
            rows.extend(SCENARIOS[name][1](sizes))
    finally:
        shared, _shared = _shared, None
        if shared:
            _close(*(t for pair in shared.values() for t in pair))
    return {"machine": machine(), "sizes": sizes.__dict__, "seconds": round(
        time.monotonic() - t0, 2), "rows": [r.as_dict() for r in rows], "_rows": rows}


def format_table(rows: list[Row]) -> str:
    """The rows as a table; each figure's unit in its own column (the ratio is meshant's
    cost over raw pyzmq's: above 1.00x, meshant is slower)."""
    lines = [f"{'scenario':48} {'metric':>10} {'unit':>8} {'meshant':>11} {'raw pyzmq':>11} "
             f"{'ratio':>7}"]
    for r in rows:
        raw = "-" if r.raw is None else f"{r.raw:,.1f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(f"{r.scenario:48} {r.metric:>10} {UNITS.get(r.unit, r.unit):>8} "
                     f"{r.meshant:>11,.1f} {raw:>11} {ratio:>7}")
    return "\n".join(lines)


UNITS = {"us": "µs"}  # as the table shows a unit (the JSON and CSV keep the ASCII one)
