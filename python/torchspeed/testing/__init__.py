"""Helpers shared by torchspeed's tests and benchmarks."""
