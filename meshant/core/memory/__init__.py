"""Colony memory: the queen's store (journaled, published) and a peer's replica of it."""
