"""Applications built on the actors: the demo and its built-in capabilities, the
benchmarks and their topologies, and the process helpers they (and the tests) share.
Nothing below the CLI imports this package."""
