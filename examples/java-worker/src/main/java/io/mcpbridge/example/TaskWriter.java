package io.mcpbridge.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes a task's records: events as they happen through an idempotent producer, and the outcome
 * (terminal status, the {@code finished} mark, the job's offset) in one transaction.
 */
final class TaskWriter implements AutoCloseable {

    private static final String CONTENT_TYPE = "content-type";
    private static final byte[] JSON_TYPE = "application/json".getBytes(StandardCharsets.UTF_8);

    private final WorkerConfig config;
    private final ObjectMapper json;
    private final KafkaProducer<byte[], byte[]> events;
    private final KafkaProducer<byte[], byte[]> outcomes;

    TaskWriter(WorkerConfig config, ObjectMapper json) {
        this.config = config;
        this.json = json;
        this.events = new KafkaProducer<>(common(config, "java-worker-events"));
        Properties tx = common(config, "java-worker-outcomes");
        // One transactional id per process: the instance id when static (a restart then fences
        // the dead process's open transaction at once), else a fresh UUID.
        String suffix = config.instanceId() != null ? config.instanceId() : UUID.randomUUID().toString();
        tx.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, config.topicPrefix() + ".java-worker." + suffix);
        tx.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        this.outcomes = new KafkaProducer<>(tx);
        this.outcomes.initTransactions();
    }

    private static Properties common(WorkerConfig config, String clientId) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrapServers());
        props.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return props;
    }

    /**
     * Writes one event of the task and waits for its acknowledgement, so that whatever follows,
     * through either producer, lands after it.
     */
    void event(String taskId, String type, ObjectNode payload) {
        try {
            events.send(eventRecord(taskId, type, payload)).get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while writing an event", e);
        } catch (ExecutionException e) {
            throw new IllegalStateException("an event of task " + Log.id(taskId) + " was not written", e.getCause());
        }
    }

    /**
     * The outcome, in one transaction: the terminal status (when not null), the finished mark,
     * and the job's next offset for the group. A commit that fails leaves none of the three.
     */
    void outcome(String taskId, ObjectNode status, TopicPartition job, long nextOffset, ConsumerGroupMetadata group) {
        outcomes.beginTransaction();
        try {
            if (status != null) {
                outcomes.send(eventRecord(taskId, config.eventType("task.status"), status));
                ObjectNode finished = json.createObjectNode().put("type", "finished").put("taskId", taskId);
                outcomes.send(record(config.controlTopic(), taskId, finished));
            }
            outcomes.sendOffsetsToTransaction(Map.of(job, new OffsetAndMetadata(nextOffset)), group);
            if (config.testHaltInOutcome() && status != null && "completed".equals(status.path("status").asText())) {
                haltInsideTheTransaction();
            }
            outcomes.commitTransaction();
        } catch (RuntimeException e) {
            abortQuietly();
            throw e;
        }
    }

    /**
     * Tests only (WORKER_TEST_HALT_IN_OUTCOME=1): the status, the mark and the offset are sent
     * and flushed, the transaction is open, and the process dies as a SIGKILL would leave it.
     */
    private void haltInsideTheTransaction() {
        outcomes.flush();
        Log.info("test: halting inside the outcome transaction");
        Runtime.getRuntime().halt(137);
    }

    private void abortQuietly() {
        try {
            outcomes.abortTransaction();
        } catch (RuntimeException ignored) {
            // fenced or fatal: the caller's exception says so; the process then stops
        }
    }

    private ProducerRecord<byte[], byte[]> eventRecord(String taskId, String type, ObjectNode payload) {
        ObjectNode envelope = json.createObjectNode();
        envelope.put("type", type);
        envelope.set("payload", payload);
        envelope.put("timestamp", System.currentTimeMillis());
        return record(config.eventsTopic(), taskId, envelope);
    }

    private ProducerRecord<byte[], byte[]> record(String topic, String taskId, ObjectNode value) {
        byte[] bytes;
        try {
            bytes = json.writeValueAsBytes(value);
        } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
            throw new IllegalStateException("a message could not be written as JSON", e);
        }
        // No partition given: the default partitioner puts the task id where its task.created is.
        ProducerRecord<byte[], byte[]> record =
                new ProducerRecord<>(topic, taskId.getBytes(StandardCharsets.UTF_8), bytes);
        record.headers().add(CONTENT_TYPE, JSON_TYPE);
        return record;
    }

    @Override
    public void close() {
        events.close(Duration.ofSeconds(5));
        outcomes.close(Duration.ofSeconds(5));
    }
}
