package io.mcpbridge.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * What the control topic says about each task: cancelled, finished, and the answers given.
 *
 * <p>Read from every partition without a consumer group (a cancel or an answer may concern a job
 * this worker has not taken yet), read_committed, starting {@code controlLookbackMs} ago.
 *
 * <p>Nothing is forgotten by age: a job may wait in its topic for hours behind others, and its
 * cancel or {@code finished} mark must still be known when it starts. Memory is bounded by
 * count instead: beyond {@code controlMaxTasks} tasks the one heard of least recently goes.
 */
final class ControlState implements AutoCloseable {

    /** Everything known of one task from the control topic. */
    static final class Task {
        boolean cancelled;
        boolean finished;
        final Map<String, JsonNode> answers = new HashMap<>();
    }

    private final KafkaConsumer<byte[], byte[]> consumer;
    private final ObjectMapper json;
    private final long lookbackMs;
    private final String controlTopic;
    private final Map<String, Task> tasks;

    ControlState(WorkerConfig config, ObjectMapper json) {
        this.json = json;
        this.lookbackMs = config.controlLookbackMs();
        this.controlTopic = config.controlTopic();
        int max = config.controlMaxTasks();
        this.tasks = new LinkedHashMap<>(1024, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Task> eldest) {
                return size() > max;
            }
        };
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrapServers());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-worker-control");
        this.consumer = new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    /** Assigns every partition, seeks to the lookback window, and reads up to the end. */
    void catchUp(Duration bound) {
        List<TopicPartition> partitions = new ArrayList<>();
        for (var info : consumer.partitionsFor(controlTopic)) {
            partitions.add(new TopicPartition(info.topic(), info.partition()));
        }
        if (partitions.isEmpty()) {
            throw new IllegalStateException("the control topic " + controlTopic + " has no partitions");
        }
        consumer.assign(partitions);
        long since = System.currentTimeMillis() - lookbackMs;
        Map<TopicPartition, Long> query = new HashMap<>();
        partitions.forEach(tp -> query.put(tp, since));
        Map<TopicPartition, OffsetAndTimestamp> found = consumer.offsetsForTimes(query);
        Map<TopicPartition, Long> ends = consumer.endOffsets(partitions);
        for (TopicPartition tp : partitions) {
            OffsetAndTimestamp at = found.get(tp);
            consumer.seek(tp, at == null ? ends.get(tp) : at.offset());
        }
        long deadline = System.currentTimeMillis() + bound.toMillis();
        // read_committed: the end to reach is the last stable offset, which endOffsets gives.
        ends = consumer.endOffsets(partitions);
        while (!reached(ends)) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("the control topic could not be read to its end in " + bound);
            }
            poll(Duration.ofMillis(100));
        }
    }

    private boolean reached(Map<TopicPartition, Long> ends) {
        for (var end : ends.entrySet()) {
            if (consumer.position(end.getKey()) < end.getValue()) {
                return false;
            }
        }
        return true;
    }

    /** Reads what arrived, for at most {@code timeout}. */
    void poll(Duration timeout) {
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(timeout)) {
            apply(record);
        }
    }

    /** What is known of {@code taskId}; an empty state when nothing is. */
    Task of(String taskId) {
        Task task = tasks.get(taskId);
        return task == null ? new Task() : task;
    }

    private void apply(ConsumerRecord<byte[], byte[]> record) {
        JsonNode message;
        try {
            message = record.value() == null ? null : json.readTree(record.value());
        } catch (java.io.IOException e) {
            message = null;
        }
        if (message == null || !message.isObject()) {
            Log.info("control: ignored an unreadable message at " + record.partition() + "/" + record.offset());
            return;
        }
        String taskId = message.path("taskId").asText("");
        if (taskId.isEmpty() && record.key() != null) {
            taskId = new String(record.key(), StandardCharsets.UTF_8);
        }
        if (taskId.isEmpty()) {
            return;
        }
        String type = message.path("type").asText("");
        Task task;
        switch (type) {
            case "cancel" -> {
                task = tasks.computeIfAbsent(taskId, k -> new Task());
                task.cancelled = true; // any statusMessage is ignored: the wording is the contract's
            }
            case "finished" -> {
                task = tasks.computeIfAbsent(taskId, k -> new Task());
                task.finished = true;
            }
            case "input" -> {
                JsonNode responses = message.get("inputResponses");
                if (responses == null || !responses.isObject()) {
                    return;
                }
                task = tasks.computeIfAbsent(taskId, k -> new Task());
                for (Iterator<Map.Entry<String, JsonNode>> it = responses.fields(); it.hasNext(); ) {
                    Map.Entry<String, JsonNode> answer = it.next();
                    task.answers.put(answer.getKey(), answer.getValue());
                }
            }
            default -> {
                return; // an unknown type: readers ignore what they do not know
            }
        }
        Log.info("control: " + type + " for task " + Log.id(taskId));
    }

    @Override
    public void close() {
        consumer.close(Duration.ofSeconds(5));
    }
}
