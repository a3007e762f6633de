"""mcp-kafka-bridge: resumable MCP task event streams (SEP-2694) served from Apache Kafka.

The package is laid out along the data flow: ``envelope`` (the record format) → ``kafka``
(clients, topics, the local broker) → the event log (publisher, indexer, reader) → ``server``
(the MCP endpoint and streams) → ``cli``.
"""

__version__ = "0.2.0"
