"""Fused drop-in replacements for torch.optim optimizers (plus Lion and LAMB).

opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-3)   # was torch.optim.AdamW
"""

from . import lr_scheduler
from ._fused import FusedOptimizer
from .adam import Adam, AdamW
from .lamb import LAMB
from .lion import Lion
from .sgd import SGD

__all__ = ["Adam", "AdamW", "SGD", "Lion", "LAMB", "FusedOptimizer", "lr_scheduler"]
