"""The development tooling beside the runtime package (not in its wheel): the local Kafka
broker, cluster and fault proxy (:mod:`bridgedev.kafka`), the demo (:mod:`bridgedev.demo`),
``bridge replay`` (:mod:`bridgedev.replay`) and the offline log checker
(:mod:`bridgedev.checker`). See docs/development.md."""
