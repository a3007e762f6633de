"""What the tests share: Kafka topics for a test (layout), bridge subprocesses (procs), MCP over
real HTTP (mcp), Server-Sent Events (sse) and bounded waits (waits).

Error codes come from :mod:`bridge.vocabulary`; the conformance suite (tests/conformance) keeps its
own copies of what it needs, since it runs against servers that are not this project.
"""
