"""Tasks (the MCP tasks extension) kept in Kafka: messages to workers and the task service."""
