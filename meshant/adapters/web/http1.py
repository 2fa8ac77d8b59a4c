"""HTTP/1.1 framing, sans-IO: a request's head parsed from bytes, a response rendered to
bytes. Strict where laxness lets two parsers disagree (request smuggling): one
Content-Length, no Transfer-Encoding, no folded or malformed header lines."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

from meshant.adapters.web.policy import Limits

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TARGET = re.compile(r"^(/[\x21-\x7e]*|\*)$")
_SINGLE = ("host", "content-length", "authorization", "origin")


class HttpError(Exception):
    """A request that cannot be served: answer ``status`` with ``reason`` and close."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request's line and headers (names lower-case; a repeated one joined by ', ')."""

    method: str
    target: str
    version: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    @property
    def keep_alive(self) -> bool:
        conn = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn

    @property
    def content_length(self) -> int:
        return int(self.headers.get("content-length", "0"))


def parse_head(data: bytes, limits: Limits) -> RequestHead:
    """The head of one request (its bytes up to and without the blank line); raises
    HttpError for anything this server will not take."""
    if len(data) > limits.max_head:
        raise HttpError(431, f"the request's head is over {limits.max_head} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "the request's head must be ASCII") from None
    line, *lines = text.lstrip("\r\n").split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not _TARGET.match(parts[1]):
        raise HttpError(400, "a request line is METHOD /PATH HTTP/1.1")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.1 and HTTP/1.0 are served")
    if len(lines) > limits.max_headers:
        raise HttpError(431, f"more than {limits.max_headers} header lines")
    headers: dict[str, str] = {}
    for h in lines:
        name, sep, value = h.partition(":")
        if not sep or not _TOKEN.match(name) or any(c in value for c in "\r\n\x00"):
            raise HttpError(400, f"malformed header line {h[:60]!r}")
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key in _SINGLE:
                raise HttpError(400, f"more than one {name} header")
            value = headers[key] + ", " + value
        headers[key] = value
    if "transfer-encoding" in headers:
        raise HttpError(501, "Transfer-Encoding is not accepted: send a Content-Length")
    cl = headers.get("content-length")
    if cl is not None and (not cl.isdigit() or len(cl) > 12):
        raise HttpError(400, "Content-Length must be a number")
    return RequestHead(method, target, version, headers)


def render(status: int, body: bytes = b"", headers: Iterable[tuple[str, str]] = (), *,
           head_only: bool = False, close: bool = False, length: bool = True) -> bytes:
    """A response: its status line, ``headers``, Content-Length (unless ``length`` is
    false, for a stream that ends with the connection) and ``body`` (not sent for
    HEAD)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}", "Server: meshant"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if head_only else out + body


__all__ = ["HttpError", "RequestHead", "parse_head", "render"]
