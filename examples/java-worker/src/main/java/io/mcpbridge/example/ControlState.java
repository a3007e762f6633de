package io.mcpbridge.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * What the control topic said about each task: cancel requests, input answers and "finished"
 * marks (docs/workers.md, "The control topic"). A group-less consumer assigned every partition,
 * reading committed records only, from {@code controlLookbackMs} ago: a cancel or an answer
 * given before this worker started is known to the jobs it runs.
 */
final class ControlState implements AutoCloseable {

  /** One task's state, as the control topic tells it. */
  static final class Task {
    boolean cancelled;
    boolean finished;
    final Map<String, JsonNode> answers = new HashMap<>();
  }

  private final KafkaConsumer<byte[], byte[]> consumer;
  private final ObjectMapper json;
  /** Grows with the tasks seen in the lookback window; a long-lived worker would drop the
   * entries of tasks older than the window (kept simple here). */
  private final Map<String, Task> tasks = new HashMap<>();

  ControlState(WorkerConfig config, ObjectMapper json) {
    this.json = json;
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrap());
    props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "latest");
    props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
    consumer =
        new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    List<TopicPartition> partitions = new ArrayList<>();
    for (PartitionInfo info : consumer.partitionsFor(config.controlTopic())) {
      partitions.add(new TopicPartition(info.topic(), info.partition()));
    }
    consumer.assign(partitions);
    long since = Math.max(0, System.currentTimeMillis() - config.controlLookbackMs());
    Map<TopicPartition, Long> times = new HashMap<>();
    partitions.forEach(tp -> times.put(tp, since));
    Map<TopicPartition, OffsetAndTimestamp> starts = consumer.offsetsForTimes(times);
    Map<TopicPartition, Long> ends = consumer.endOffsets(partitions);
    for (TopicPartition tp : partitions) {
      OffsetAndTimestamp start = starts.get(tp);
      consumer.seek(tp, start != null ? start.offset() : ends.get(tp));
    }
    // Read what the window holds before any job runs.
    while (partitions.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
      poll(Duration.ofMillis(200));
    }
  }

  /** Take what arrived on the control topic, waiting at most {@code wait} for it. */
  void poll(Duration wait) {
    for (ConsumerRecord<byte[], byte[]> record : consumer.poll(wait)) {
      apply(record);
    }
  }

  Task of(String taskId) {
    return tasks.computeIfAbsent(taskId, id -> new Task());
  }

  private void apply(ConsumerRecord<byte[], byte[]> record) {
    JsonNode message;
    try {
      message = json.readTree(record.value());
    } catch (Exception unreadable) {
      System.err.println("ignoring an unreadable control message at offset " + record.offset());
      return;
    }
    if (message == null || !message.path("taskId").isTextual()) {
      return;
    }
    Task task = of(message.get("taskId").asText());
    switch (message.path("type").asText()) {
      case "cancel" -> task.cancelled = true;
      case "finished" -> task.finished = true;
      case "input" -> message.path("inputResponses").fields()
          .forEachRemaining(e -> task.answers.put(e.getKey(), e.getValue()));
      default -> { } // a type this worker does not know: ignored, as the contract says
    }
  }

  static String key(byte[] key) {
    return key == null ? "" : new String(key, StandardCharsets.UTF_8);
  }

  @Override
  public void close() {
    consumer.close();
  }
}
