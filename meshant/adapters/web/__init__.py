"""The rules and the machinery every meshant HTTP surface shares — the queen's dashboard
and metrics now, gateways later: limits and timeouts (:class:`Limits`), who may ask what
(:class:`Policy`: Host, Origin, tokens), sans-IO HTTP/1.1 framing (:mod:`.http1`), a
bounded single-thread asyncio server (:mod:`.server`) and the same policy as ASGI
middleware (:mod:`.asgi`). Standard library only; nothing here imports an actor."""

from meshant.adapters.web.policy import Access, Flags, Limits, Policy, Verdict

__all__ = ["Access", "Flags", "Limits", "Policy", "Verdict"]
