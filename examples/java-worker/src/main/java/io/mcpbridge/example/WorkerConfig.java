package io.mcpbridge.example;

import java.util.Map;

/**
 * What the worker needs to know, from environment variables (docs/workers.md, "Topics and
 * keys"). Every name derives from the bridge's topic prefix and event type prefix, which must
 * be the bridge's own.
 */
record WorkerConfig(
    String bootstrap,
    String topicPrefix,
    String eventTypePrefix,
    String tool,
    String jobTopic,
    String groupId,
    String instanceId,
    long controlLookbackMs,
    long stepMs,
    int sessionTimeoutMs) {

  static WorkerConfig fromEnv(Map<String, String> env) {
    String prefix = env.getOrDefault("WORKER_TOPIC_PREFIX", "mcpbridge");
    String tool = env.getOrDefault("WORKER_TOOL", "java_count");
    return new WorkerConfig(
        env.getOrDefault("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        prefix,
        env.getOrDefault("WORKER_EVENT_TYPE_PREFIX", "io.mcpbridge"),
        tool,
        env.getOrDefault("WORKER_JOB_TOPIC", prefix + ".jobs." + tool),
        env.getOrDefault("WORKER_GROUP_ID", prefix + ".workers"),
        env.get("WORKER_INSTANCE_ID"),
        Long.parseLong(env.getOrDefault("WORKER_CONTROL_LOOKBACK_MS", "3600000")),
        Long.parseLong(env.getOrDefault("WORKER_STEP_MS", "200")),
        Integer.parseInt(env.getOrDefault("WORKER_SESSION_TIMEOUT_MS", "10000")));
  }

  String eventsTopic() {
    return topicPrefix + ".task-events";
  }

  String controlTopic() {
    return topicPrefix + ".task-control";
  }

  String statusType() {
    return eventTypePrefix + ".task.status";
  }

  String progressType() {
    return eventTypePrefix + ".progress";
  }
}
