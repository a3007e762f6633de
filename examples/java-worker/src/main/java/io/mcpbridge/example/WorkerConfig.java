package io.mcpbridge.example;

import java.util.Map;

/** The worker's settings, from the environment, and the names the contract derives from them. */
record WorkerConfig(
        String bootstrapServers,
        String topicPrefix,
        String eventTypePrefix,
        String tool,
        String jobTopic,
        String groupId,
        String instanceId,
        long controlLookbackMs,
        long stepMs,
        int sessionTimeoutMs,
        int concurrency,
        int controlMaxTasks,
        boolean testHaltInOutcome) {

    /** Reads every WORKER_* variable (docs/workers.md, "The Java reference worker"). */
    static WorkerConfig fromEnvironment(Map<String, String> env) {
        String prefix = env.getOrDefault("WORKER_TOPIC_PREFIX", "mcpbridge");
        String tool = env.getOrDefault("WORKER_TOOL", "java_count");
        String instance = env.get("WORKER_INSTANCE_ID");
        return new WorkerConfig(
                env.getOrDefault("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                prefix,
                env.getOrDefault("WORKER_EVENT_TYPE_PREFIX", "io.mcpbridge"),
                tool,
                env.getOrDefault("WORKER_JOB_TOPIC", prefix + ".jobs." + tool),
                env.getOrDefault("WORKER_GROUP_ID", prefix + ".workers"),
                instance == null || instance.isBlank() ? null : instance,
                positive(env, "WORKER_CONTROL_LOOKBACK_MS", 3_600_000L),
                positive(env, "WORKER_STEP_MS", 200L),
                (int) positive(env, "WORKER_SESSION_TIMEOUT_MS", 10_000L),
                (int) Math.min(positive(env, "WORKER_CONCURRENCY", 4L), 1_000L),
                (int) Math.min(positive(env, "WORKER_CONTROL_MAX_TASKS", 200_000L), 10_000_000L),
                // Tests only: the process halts inside its first completed outcome's transaction.
                "1".equals(env.get("WORKER_TEST_HALT_IN_OUTCOME")));
    }

    private static long positive(Map<String, String> env, String name, long fallback) {
        String raw = env.get(name);
        if (raw == null || raw.isBlank()) {
            return fallback;
        }
        long value;
        try {
            value = Long.parseLong(raw.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be a whole number, not '" + raw + "'");
        }
        if (value <= 0) {
            throw new IllegalArgumentException(name + " must be positive, not " + value);
        }
        return value;
    }

    /** Where every task's events go (key = task id). */
    String eventsTopic() {
        return topicPrefix + ".task-events";
    }

    /** Where cancel, input and finished travel (key = task id). */
    String controlTopic() {
        return topicPrefix + ".task-control";
    }

    /** A full event type under the bridge's event type prefix, e.g. io.mcpbridge.progress. */
    String eventType(String suffix) {
        return eventTypePrefix + "." + suffix;
    }
}
