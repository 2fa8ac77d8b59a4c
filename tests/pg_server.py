"""A real PostgreSQL server for the tests: ``initdb`` into a temporary directory,
``pg_ctl start`` on a free loopback port, stopped by its postmaster's PID.

As root (CI), the server runs as the ``postgres`` user (``initdb`` refuses root). Outside
CI a machine without PostgreSQL skips these tests; in CI (``CI`` set) it fails them, since
``.ci/run`` installs the distribution's package.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

USER = "meshant"


def bindir() -> str | None:
    """Where initdb and pg_ctl are, newest version first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return str(Path(found[-1]).parent)
    initdb = shutil.which("initdb")
    return str(Path(initdb).parent) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One throwaway cluster. ``url(db)`` names a database in it."""

    def __init__(self) -> None:
        bins = bindir()
        if bins is None:
            if os.environ.get("CI"):
                raise RuntimeError("PostgreSQL is not installed (.ci/run should have done it)")
            pytest.skip("PostgreSQL is not installed here (initdb not found)")
        self.bin = bins
        self.dir = Path(tempfile.mkdtemp(prefix="meshant-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = _free_port()
        self.pid: int | None = None
        self._as: list[str] = []
        if os.geteuid() == 0:
            # initdb refuses root: the server runs as postgres, which must own its files.
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o700)
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self._as, f"{self.bin}/{tool}", *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l",
                  str(self.log), "-o", opts)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        # If this test process dies without its teardown (killed, os._exit), a watchdog
        # still stops the server: it outlives nothing that started it.
        # (Only while its postmaster.pid still names that PID: never a reused one.)
        pidfile = self.data / "postmaster.pid"
        script = (f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                  f"[ \"$(head -1 {pidfile} 2>/dev/null)\" = {self.pid} ] && "
                  f"kill -INT {self.pid}; sleep 2; rm -rf {self.dir}")
        # posix_spawn, not Popen: nobody waits for it (it outlives this process), and a
        # Popen left running warns when it is collected.
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.posix_spawnp("sh", ["sh", "-c", script], os.environ, setsid=True,
                            file_actions=[(os.POSIX_SPAWN_DUP2, null, 0),
                                          (os.POSIX_SPAWN_DUP2, null, 1),
                                          (os.POSIX_SPAWN_DUP2, null, 2)])
        finally:
            os.close(null)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> None:
        """Stop the postmaster by its PID (SIGINT: PostgreSQL's fast shutdown)."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
