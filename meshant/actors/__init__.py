"""The I/O drivers: the Queen, Forager and Client actors, each owning its sockets in
one thread and driving the sans-IO core."""
