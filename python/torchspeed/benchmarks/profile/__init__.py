"""`torchspeed bench profile`: torchspeed.profile against torch.profiler (run.py says what each
section measures)."""

from .run import main

__all__ = ["main"]
