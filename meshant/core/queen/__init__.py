"""The queen's side: the router, the state its services share, the services, the outbox,
and the end of a turn (delivery)."""
