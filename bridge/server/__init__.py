"""The serving side: the MCP endpoint, task streams, health and metrics over HTTP."""
