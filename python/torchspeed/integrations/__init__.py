"""Integrations with training frameworks: torchspeed.integrations.lightning (TorchspeedCallback)."""
