"""The peers' side: a peer's session with its queen, a forager's and a client's sessions,
and the link that drives them for every driver."""
