"""The log side: publishing task events, deriving seq from the partition log, reading it back.

``publisher`` (producers) → Kafka events topic → ``indexer`` (derives seq, folds status,
persists ``seqindex`` state to the compacted index topic; its parts are ``ownership``,
``indexrestore``, ``seqtail``, ``indexwriter`` and ``reconcile``) → ``reader`` (seeks by
checkpoint, derives earliestSeq from retention).
"""
