"""PUB topics: the queen's own (``$``-prefixed) and users' broadcasts (``u.`` + topic)."""

from __future__ import annotations

import re

HB_TOPIC = b"$hb"  # the queen's heartbeat, to every peer
MEM_TOPIC = b"$mem"  # colony memory updates
USER_PREFIX = b"u."  # user broadcasts: kept apart from the queen's own topics
TOPIC_MAX = 200

_TOPIC_RE = re.compile(rf"^[A-Za-z0-9._:/-]{{1,{TOPIC_MAX}}}$")


def valid_topic(topic: object) -> bool:
    """User broadcast topics: 1-200 characters of ``A-Z a-z 0-9 . _ : / -``."""
    return isinstance(topic, str) and bool(_TOPIC_RE.match(topic))


__all__ = ["HB_TOPIC", "MEM_TOPIC", "TOPIC_MAX", "USER_PREFIX", "valid_topic"]
