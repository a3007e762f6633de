"""SEP-2694 (resumable task event streams) conformance suite: see README.md."""
