"""Tasks: the model (a task, its attempts, their lifecycles as tables), the scheduler that
is the only writer of that state, and its parts (ready queues, timers, circuit breakers,
dead letters); what the scheduler decides leaves as typed work."""
