package io.mcpbridge.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The reference worker of docs/workers.md, for one tool, {@code java_count}: it counts to
 * {@code arguments.count}, one progress event and one {@code com.example.count.tick} event a
 * step, asks the client to confirm halfway when {@code arguments.confirm} is true, and
 * completes with the count as its result.
 *
 * <p>Jobs are consumed in the workers' consumer group with auto-commit off; a job's offset is
 * committed in the transaction that writes its outcome, so a worker killed mid-job leaves the
 * job to the next member (or to itself, restarted: static membership hands it the same
 * partitions at once). One job at a time; between steps the worker reads the control topic
 * (cancel, input answers, "finished") and keeps its group membership alive.
 */
public final class CountWorker implements AutoCloseable {

  private static final String CONFIRM_KEY = "confirm";

  private final WorkerConfig config;
  private final ObjectMapper json = new ObjectMapper();
  private final ControlState control;
  private final TaskWriter writer;
  private final KafkaConsumer<byte[], byte[]> jobs;
  /** Partitions taken away by a rebalance while a job ran (its new owner runs the job). */
  private final Set<TopicPartition> revoked = new HashSet<>();
  private boolean busy;

  /** Why a job stops without an outcome: another worker runs it, or already ended the task. */
  private static final class Abandoned extends Exception {
    Abandoned(String why) {
      super(why, null, false, false);
    }
  }

  CountWorker(WorkerConfig config) {
    this.config = config;
    control = new ControlState(config, json);
    writer = new TaskWriter(config, json);
    jobs = new KafkaConsumer<>(jobProps(), new ByteArrayDeserializer(),
        new ByteArrayDeserializer());
    jobs.subscribe(List.of(config.jobTopic()), new Rebalance());
  }

  private Properties jobProps() {
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrap());
    props.put(ConsumerConfig.GROUP_ID_CONFIG, config.groupId());
    if (config.instanceId() != null) {
      props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, config.instanceId());
    }
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "1");
    props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(config.sessionTimeoutMs()));
    props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG,
        String.valueOf(Math.max(100, config.sessionTimeoutMs() / 4)));
    // Only the partitions that move are revoked, so a member joining does not stop our job.
    props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
        CooperativeStickyAssignor.class.getName());
    return props;
  }

  /** Take jobs until the process is stopped. */
  void run() throws InterruptedException {
    System.err.println("java worker ready: tool " + config.tool() + " on " + config.jobTopic());
    while (true) {
      control.poll(Duration.ZERO);
      for (ConsumerRecord<byte[], byte[]> record : jobs.poll(Duration.ofMillis(200))) {
        runJob(record);
      }
    }
  }

  private void runJob(ConsumerRecord<byte[], byte[]> record) throws InterruptedException {
    TopicPartition tp = new TopicPartition(record.topic(), record.partition());
    String taskId = ControlState.key(record.key());
    busy = true;
    revoked.clear();
    jobs.pause(jobs.assignment());
    try {
      ObjectNode outcome = outcome(taskId, record);
      if (outcome != null) {
        writer.finish(taskId, outcome, tp, record.offset() + 1, jobs.groupMetadata());
        System.err.println("task " + taskId + " ended " + outcome.path("status").asText());
      } else {
        jobs.commitSync(Map.of(tp, new OffsetAndMetadata(record.offset() + 1)));
      }
    } catch (Abandoned abandoned) {
      System.err.println("task " + taskId + ": " + abandoned.getMessage());
    } catch (CommitFailedException moved) {
      // A rebalance gave the job's partition to another member while this copy ended it: the
      // transaction was aborted, nothing of it is visible, and the new owner runs the job.
      System.err.println("task " + taskId + ": the job moved to another worker; it runs it");
    } finally {
      busy = false;
      jobs.resume(jobs.assignment());
    }
  }

  /** The job's terminal status, or null when the task already ended (nothing to write). */
  private ObjectNode outcome(String taskId, ConsumerRecord<byte[], byte[]> record)
      throws InterruptedException, Abandoned {
    JsonNode job;
    try {
      job = json.readTree(record.value());
    } catch (Exception unreadable) {
      job = null;
    }
    if (job == null || !job.path("taskId").isTextual() || taskId.isEmpty()) {
      // Never leave the task working for ever: it fails with a clear error.
      return failed(-32603, "the job request could not be read");
    }
    ControlState.Task task = control.of(taskId);
    if (task.finished) {
      return null; // a copy of this job already wrote the outcome
    }
    if (task.cancelled) {
      return status("cancelled").put("statusMessage", "cancelled before it started");
    }
    try {
      return count(taskId, job.path("arguments"), task);
    } catch (Cancelled cancelled) {
      return status("cancelled").put("statusMessage", "cancelled at the client's request");
    }
  }

  private static final class Cancelled extends Exception {
    Cancelled() {
      super(null, null, false, false);
    }
  }

  private ObjectNode count(String taskId, JsonNode arguments, ControlState.Task task)
      throws InterruptedException, Abandoned, Cancelled {
    long total = arguments.path("count").asLong(5);
    if (total < 1 || total > 10_000) {
      return failed(-32602, "count must be between 1 and 10000");
    }
    boolean confirm = arguments.path("confirm").asBoolean(false);
    String answer = "not asked";
    for (long step = 1; step <= total; step++) {
      if (confirm && step == (total + 1) / 2) {
        answer = ask(taskId, task, total);
      }
      work(task);
      writer.progress(taskId, step, total, "step " + step + " of " + total);
      writer.event(taskId, "com.example.count.tick", json.createObjectNode().put("n", step));
    }
    ObjectNode result = json.createObjectNode();
    result.putArray("content").addObject().put("type", "text")
        .put("text", "Counted to " + total + " (confirmation: " + answer + ")");
    result.putObject("structuredContent").put("count", total).put("confirmation", answer);
    ObjectNode done = status("completed");
    done.set("result", result);
    return done;
  }

  /** One step of work; the control topic is read meanwhile, so a cancel stops it at once. */
  private void work(ControlState.Task task) throws Abandoned, Cancelled {
    long deadline = System.currentTimeMillis() + config.stepMs();
    do {
      control.poll(Duration.ofMillis(Math.max(1, Math.min(50, deadline - now()))));
      checkStill(task);
    } while (now() < deadline);
  }

  /** Ask for confirmation (once: an answer given to an earlier attempt is reused). */
  private String ask(String taskId, ControlState.Task task, long total)
      throws InterruptedException, Abandoned, Cancelled {
    if (!task.answers.containsKey(CONFIRM_KEY)) {
      ObjectNode parked = status("input_required")
          .put("statusMessage", "waiting for confirmation");
      ObjectNode params = parked.putObject("inputRequests").putObject(CONFIRM_KEY)
          .put("method", "elicitation/create").putObject("params")
          .put("message", "Count on to " + total + "?");
      ObjectNode schema = params.putObject("requestedSchema").put("type", "object");
      schema.putObject("properties").putObject("confirm").put("type", "boolean");
      schema.putArray("required").add("confirm");
      writer.status(taskId, parked);
    }
    while (!task.answers.containsKey(CONFIRM_KEY)) {
      control.poll(Duration.ofMillis(100));
      checkStill(task);
    }
    JsonNode answer = task.answers.get(CONFIRM_KEY);
    boolean accepted = "accept".equals(answer.path("action").asText())
        && answer.path("content").path("confirm").asBoolean(false);
    return accepted ? "confirmed" : "declined";
  }

  /** Stop when the client cancelled, the task ended elsewhere, or the job moved away. */
  private void checkStill(ControlState.Task task) throws Abandoned, Cancelled {
    keepMembership();
    if (task.finished) {
      throw new Abandoned("another worker ended the task; this copy writes nothing more");
    }
    if (!revoked.isEmpty()) {
      throw new Abandoned("the job's partition moved to another worker, which runs it now");
    }
    if (task.cancelled) {
      throw new Cancelled();
    }
  }

  /** Poll the paused job consumer: the group keeps this member, and rebalances complete. */
  private void keepMembership() {
    ConsumerRecords<byte[], byte[]> records = jobs.poll(Duration.ZERO);
    for (TopicPartition tp : records.partitions()) {
      // A partition assigned mid-job and fetched before it was paused: read it again later.
      jobs.seek(tp, records.records(tp).get(0).offset());
    }
  }

  private ObjectNode status(String status) {
    return json.createObjectNode().put("status", status);
  }

  private ObjectNode failed(int code, String message) {
    ObjectNode failed = status("failed").put("statusMessage", message);
    failed.putObject("error").put("code", code).put("message", message);
    return failed;
  }

  private static long now() {
    return System.currentTimeMillis();
  }

  private final class Rebalance implements ConsumerRebalanceListener {
    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
      if (busy) {
        revoked.addAll(partitions);
      }
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
      if (busy) {
        jobs.pause(partitions); // one job at a time: the new partitions wait for this one
      }
    }
  }

  @Override
  public void close() {
    jobs.close();
    writer.close();
    control.close();
  }

  /** Run the worker until the process is killed; a restart with the same WORKER_INSTANCE_ID
   * takes its partitions back at once (static group membership). */
  public static void main(String[] args) throws Exception {
    WorkerConfig config = WorkerConfig.fromEnv(System.getenv());
    try (CountWorker worker = new CountWorker(config)) {
      worker.run();
    }
  }
}
