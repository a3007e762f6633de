"""Kafka plumbing of the bridge: the broker provider and the Kafka-facing modules."""
