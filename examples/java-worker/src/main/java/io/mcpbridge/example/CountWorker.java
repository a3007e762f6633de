package io.mcpbridge.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Collection;
import java.util.Deque;
import java.util.HashMap;
import java.util.Map;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The worker of the tool {@code java_count}, kept to docs/workers.md: it counts to
 * {@code arguments.count}, one progress and one {@code com.example.count.tick} event a step,
 * asks to confirm halfway when {@code arguments.confirm} is true, and honours cancel.
 *
 * <p>One thread, one job at a time: the loop polls the control topic, polls the job topic (its
 * partitions paused while a job is held, so the member stays in the group however long a job
 * waits for input), and advances the job by at most one step.
 */
public final class CountWorker {

    private static final Duration IDLE_POLL = Duration.ofMillis(50);

    private final WorkerConfig config;
    private final ObjectMapper json = new ObjectMapper();
    private final ControlState control;
    private final TaskWriter writer;
    private final KafkaConsumer<byte[], byte[]> jobs;
    private final Deque<ConsumerRecord<byte[], byte[]>> pending = new ArrayDeque<>();
    private CountJob current;
    private volatile boolean running = true;

    CountWorker(WorkerConfig config) {
        this.config = config;
        this.control = new ControlState(config, json);
        this.writer = new TaskWriter(config, json);
        this.jobs = new KafkaConsumer<>(jobConsumerProps(config), new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    private static Properties jobConsumerProps(WorkerConfig config) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrapServers());
        props.put(ConsumerConfig.GROUP_ID_CONFIG, config.groupId());
        if (config.instanceId() != null) {
            props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, config.instanceId());
        }
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-worker-jobs");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "1");
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, Integer.toString(config.sessionTimeoutMs()));
        props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, CooperativeStickyAssignor.class.getName());
        return props;
    }

    /** Runs until SIGTERM or SIGINT. */
    public static void main(String[] args) throws InterruptedException {
        WorkerConfig config = WorkerConfig.fromEnvironment(System.getenv());
        Log.info("starting: tool " + config.tool() + ", topic prefix " + config.topicPrefix());
        CountWorker worker = new CountWorker(config);
        CountDownLatch stopped = new CountDownLatch(1);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            worker.running = false;
            worker.jobs.wakeup();
            try {
                stopped.await();
            } catch (InterruptedException e) {
                main.interrupt();
            }
        }));
        try {
            worker.run();
        } finally {
            stopped.countDown();
        }
    }

    void run() {
        try (control; writer; jobs) {
            long began = System.currentTimeMillis();
            control.catchUp(Duration.ofSeconds(60));
            Log.info("control topic read to its end in " + (System.currentTimeMillis() - began) + " ms");
            jobs.subscribe(List.of(config.jobTopic()), new Rebalance());
            Log.info("serving tool " + config.tool() + " from " + config.jobTopic() + " in group " + config.groupId());
            while (running) {
                control.poll(Duration.ZERO);
                for (ConsumerRecord<byte[], byte[]> record : jobs.poll(pollTimeout())) {
                    pending.add(record);
                }
                step();
                pauseWhileBusy();
            }
        } catch (WakeupException e) {
            // shutting down
        }
        Log.info("stopped");
    }

    /** Starts the next job or advances the current one; an event that cannot be written puts it back. */
    private void step() {
        ConsumerRecord<byte[], byte[]> next = current == null ? pending.poll() : null;
        try {
            if (next != null) {
                current = CountJob.start(next, this);
            }
            if (current != null && current.advance()) {
                current = null;
            }
        } catch (IllegalStateException e) {
            ConsumerRecord<byte[], byte[]> job = current != null ? current.record() : next;
            Log.info("a job stops on an error (" + e + "); it will be read again");
            current = null;
            pending.addFirst(job);
            rewind();
        }
    }

    /** Puts every held job back: each partition is read again from its first held job. */
    private void rewind() {
        Map<TopicPartition, Long> first = new HashMap<>();
        for (ConsumerRecord<byte[], byte[]> r : pending) {
            first.merge(new TopicPartition(r.topic(), r.partition()), r.offset(), Math::min);
        }
        pending.clear();
        first.forEach((tp, offset) -> {
            if (jobs.assignment().contains(tp)) {
                jobs.seek(tp, offset);
            }
        });
    }

    private Duration pollTimeout() {
        if (current == null) {
            return pending.isEmpty() ? IDLE_POLL : Duration.ZERO;
        }
        long wait = current.millisToNextStep();
        return Duration.ofMillis(Math.max(0, Math.min(wait, IDLE_POLL.toMillis())));
    }

    /** Held jobs keep their partitions paused: the member goes on polling, nothing more comes. */
    private void pauseWhileBusy() {
        var assigned = jobs.assignment();
        if (current != null || !pending.isEmpty()) {
            jobs.pause(assigned);
        } else if (!jobs.paused().isEmpty()) {
            jobs.resume(jobs.paused());
        }
    }

    /** Jobs read from partitions that moved away are dropped: their new owner runs them. */
    private final class Rebalance implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            pending.removeIf(r -> partitions.contains(new TopicPartition(r.topic(), r.partition())));
            if (current != null && partitions.contains(current.partition())) {
                Log.info("task " + Log.id(current.taskId()) + ": its partition moved away, the job stops here");
                current = null;
            }
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            if (!partitions.isEmpty()) {
                Log.info("assigned " + partitions);
            }
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            onPartitionsRevoked(partitions);
        }
    }

    // What CountJob needs of its worker.

    WorkerConfig config() {
        return config;
    }

    ObjectMapper json() {
        return json;
    }

    ControlState control() {
        return control;
    }

    /** Writes the job's outcome; a failed commit puts the job back to be read again. */
    void finish(String taskId, ObjectNode status, ConsumerRecord<byte[], byte[]> job) {
        TopicPartition tp = new TopicPartition(job.topic(), job.partition());
        try {
            writer.outcome(taskId, status, tp, job.offset() + 1, jobs.groupMetadata());
            Log.info("task " + Log.id(taskId) + ": " + (status == null ? "skipped" : status.path("status").asText()));
        } catch (KafkaException e) {
            Log.info("task " + Log.id(taskId) + ": the outcome was not committed (" + e + "); the job will be read again");
            pending.addFirst(job);
            rewind();
            if (isFatal(e)) {
                throw e;
            }
        }
    }

    private static boolean isFatal(KafkaException e) {
        return e instanceof org.apache.kafka.common.errors.ProducerFencedException
                || e instanceof org.apache.kafka.common.errors.AuthorizationException
                || e instanceof org.apache.kafka.common.errors.UnsupportedVersionException;
    }

    /** Writes one event of the task (acknowledged before the method returns). */
    void emit(String taskId, String type, ObjectNode payload) {
        writer.event(taskId, type, payload);
    }

    static String keyOf(ConsumerRecord<byte[], byte[]> record) {
        return record.key() == null ? null : new String(record.key(), StandardCharsets.UTF_8);
    }
}
