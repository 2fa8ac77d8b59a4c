"""Nodes: a peer as the queen knows it (its model and lifecycle), the registry of them, and
the heartbeat monitor that says when one went silent."""
