"""Sinks: where micro-batches are written, exactly once."""
