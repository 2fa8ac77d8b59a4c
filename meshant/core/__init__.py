"""The sans-IO core: scheduling, liveness, policy, colony memory and the queen's
logic. Plain objects driven by method calls and a clock argument; no socket, thread or
clock read inside."""
