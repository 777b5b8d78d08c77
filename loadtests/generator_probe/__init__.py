"""Probe handlers for loadtests/generator_scheduling.py probe: a "decoder" that makes one token per step in no time,
served with TorchServe's continuousBatching (continuous_handler.py) and asyncCommunication (async_handler.py), so
that what a step costs in TorchServe itself is measured apart from any model."""
