"""Adapters the actors use to reach the world beyond their sockets: zeroconf discovery
(:mod:`.discovery`) and CURVE keys (:mod:`.security`). Nothing here imports an actor."""
