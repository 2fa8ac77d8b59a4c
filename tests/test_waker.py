"""The waker never writes to a descriptor it has closed (its number may be reused)."""

from __future__ import annotations

import os

import zmq

from meshant.actors._waker import Waker


def test_wake_wakes_a_poller_and_drain_resets() -> None:
    w = Waker()
    p = zmq.Poller()
    p.register(w.fd, zmq.POLLIN)
    assert p.poll(0) == []
    w.wake()
    w.wake()
    assert dict(p.poll(1000)).get(w.fd) == zmq.POLLIN
    w.drain()
    assert p.poll(0) == []
    w.close()


def test_wake_after_close_touches_nothing() -> None:
    w = Waker()
    fd = w.fd
    w.close()
    r, wr = os.pipe()  # likely reuses the closed number
    try:
        w.wake()
        os.set_blocking(r, False)
        try:
            data = os.read(r, 16)
        except BlockingIOError:
            data = b""
        assert data == b""
        assert fd >= 0
    finally:
        os.close(r)
        os.close(wr)
    w.close()  # idempotent


def test_wakes_before_a_drain_are_one_write_and_a_wake_after_it_wakes_again() -> None:
    w = Waker()
    p = zmq.Poller()
    p.register(w.fd, zmq.POLLIN)
    try:
        for _ in range(50):  # a burst while the loop is busy: one syscall, not fifty
            w.wake()
        assert os.eventfd_read(w.fd) == 1
        w.drain()  # (the loop's drain: nothing left to read, the wake is consumed)
        assert p.poll(0) == []
        w.wake()  # queued after the loop looked: it must wake the next poll
        assert dict(p.poll(1000)).get(w.fd) == zmq.POLLIN
        w.drain()
        assert p.poll(0) == []
    finally:
        w.close()
