"""The edges: discovery (zeroconf), CURVE keys, the demo and its capabilities, the
benchmarks and process helpers."""
