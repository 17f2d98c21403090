"""Deferrable triggers: event-driven runs of exactly-once pipelines (Asset watchers)."""
