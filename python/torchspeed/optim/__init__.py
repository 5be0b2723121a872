"""Fused drop-in replacements for torch.optim optimizers."""
