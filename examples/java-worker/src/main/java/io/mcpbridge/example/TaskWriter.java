package io.mcpbridge.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
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
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes into a task's log (docs/workers.md, "What a worker writes, in order").
 *
 * <p>Events go to the events topic keyed by the task id, in the JSON envelope with its
 * {@code content-type} header, through an idempotent acks=all producer whose default
 * partitioner (murmur2 of the key) puts them in the task's partition. Each send is awaited, so
 * the next write (by either producer) lands after it.
 *
 * <p>The outcome is one transaction of a second, transactional producer: the terminal status,
 * the "finished" mark on the control topic and the job's consumed offset commit together or
 * not at all. A worker killed anywhere leaves either all three or none (the job then runs
 * again), so the task ends once.
 */
final class TaskWriter implements AutoCloseable {

  private final WorkerConfig config;
  private final ObjectMapper json;
  private final KafkaProducer<byte[], byte[]> events;
  private final KafkaProducer<byte[], byte[]> outcomes;

  TaskWriter(WorkerConfig config, ObjectMapper json) {
    this.config = config;
    this.json = json;
    events = new KafkaProducer<>(producerProps(null), new ByteArraySerializer(),
        new ByteArraySerializer());
    // One transactional id per process: the group generation in sendOffsetsToTransaction
    // (KIP-447) fences a copy whose job partition moved elsewhere.
    String transactionalId = config.topicPrefix() + ".java-worker." + UUID.randomUUID();
    outcomes = new KafkaProducer<>(producerProps(transactionalId), new ByteArraySerializer(),
        new ByteArraySerializer());
    outcomes.initTransactions();
  }

  private Properties producerProps(String transactionalId) {
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrap());
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.put(ProducerConfig.LINGER_MS_CONFIG, "2");
    if (transactionalId != null) {
      props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
    }
    return props;
  }

  /** Append one event of {@code type} to the task's stream and wait for its acknowledgement. */
  void event(String taskId, String type, ObjectNode payload) throws InterruptedException {
    try {
      events.send(eventRecord(taskId, type, payload)).get();
    } catch (ExecutionException e) {
      throw new IllegalStateException("could not write an event of task " + taskId, e.getCause());
    }
  }

  /** A progress event: {@code <event type prefix>.progress}. */
  void progress(String taskId, long progress, long total, String message)
      throws InterruptedException {
    ObjectNode payload = json.createObjectNode().put("progress", progress).put("total", total);
    event(taskId, config.progressType(), payload.put("message", message));
  }

  /** A status event that is not terminal: {@code working} or {@code input_required}. */
  void status(String taskId, ObjectNode status) throws InterruptedException {
    event(taskId, config.statusType(), status);
  }

  /**
   * The terminal status, the "finished" mark and the job's offset, in one transaction.
   *
   * @param next the offset after the job request, committed for {@code jobPartition}
   */
  void finish(String taskId, ObjectNode terminal, TopicPartition jobPartition, long next,
      ConsumerGroupMetadata group) {
    outcomes.beginTransaction();
    try {
      outcomes.send(eventRecord(taskId, config.statusType(), terminal));
      ObjectNode finished = json.createObjectNode().put("type", "finished").put("taskId", taskId);
      outcomes.send(new ProducerRecord<>(config.controlTopic(), key(taskId), bytes(finished)));
      outcomes.sendOffsetsToTransaction(
          Map.of(jobPartition, new OffsetAndMetadata(next)), group);
      outcomes.commitTransaction();
    } catch (RuntimeException e) {
      // Nothing of the outcome is visible to read_committed readers: the job runs again.
      try {
        outcomes.abortTransaction();
      } catch (RuntimeException fenced) {
        e.addSuppressed(fenced); // a fenced producer cannot abort: the process must end
      }
      throw e;
    }
  }

  private ProducerRecord<byte[], byte[]> eventRecord(String taskId, String type,
      ObjectNode payload) {
    ObjectNode envelope = json.createObjectNode();
    envelope.put("type", type);
    envelope.set("payload", payload);
    envelope.put("timestamp", System.currentTimeMillis());
    ProducerRecord<byte[], byte[]> record =
        new ProducerRecord<>(config.eventsTopic(), key(taskId), bytes(envelope));
    record.headers().add(new RecordHeader("content-type",
        "application/json".getBytes(StandardCharsets.UTF_8)));
    return record;
  }

  private byte[] bytes(ObjectNode node) {
    try {
      return json.writeValueAsBytes(node);
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  private static byte[] key(String taskId) {
    return taskId.getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public void close() {
    events.close();
    outcomes.close();
  }
}
