package io.mcpbridge.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Deque;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The worker of the tool {@code java_count}, kept to docs/workers.md: it counts to
 * {@code arguments.count}, one progress and one {@code com.example.count.tick} event a step,
 * asks to confirm halfway when {@code arguments.confirm} is true, and honours cancel.
 *
 * <p>One thread runs up to {@code WORKER_CONCURRENCY} jobs at once: the loop polls the control
 * topic, polls the job topic (its partitions paused while the worker holds as many jobs as it
 * may run, so the member stays in the group however long a job waits for input), and advances
 * every job that is due. A job waiting for input holds one slot, never the others. Each outcome
 * commits the lowest offset of its partition whose job has not ended, so a job that ends early
 * never commits past one still running.
 */
public final class CountWorker {

    private static final Duration IDLE_POLL = Duration.ofMillis(50);
    private static final long RETRY_FIRST_MS = 250;
    private static final long RETRY_MAX_MS = 30_000;

    private final WorkerConfig config;
    private final ObjectMapper json = new ObjectMapper();
    private final ControlState control;
    private final TaskWriter writer;
    private final KafkaConsumer<byte[], byte[]> jobs;
    /** Jobs read and not started yet (a free slot, or their retry time, is awaited). */
    private final Deque<Held> pending = new ArrayDeque<>();
    private final List<CountJob> running = new ArrayList<>();
    /** Per partition: the offsets read whose jobs have not ended, and the offset after the last read. */
    private final Map<TopicPartition, TreeSet<Long>> unfinished = new HashMap<>();
    private final Map<TopicPartition, Long> readUpTo = new HashMap<>();
    /** How often each held job failed on a write (identity of the record), for the backoff. */
    private final Map<ConsumerRecord<byte[], byte[]>, Integer> failures = new IdentityHashMap<>();
    private volatile boolean live = true;

    /** A job read and not started: {@code notBeforeMs} delays a retry after a failed write. */
    private record Held(ConsumerRecord<byte[], byte[]> record, long notBeforeMs) {}

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
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(config.concurrency()));
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, Integer.toString(config.sessionTimeoutMs()));
        // Every member of one group must share an assignment protocol. The Python SDK (aiokafka)
        // speaks only "roundrobin", so it is listed too: with SDK members in the group the group
        // picks it; the cooperative one is preferred when every member offers it. With both
        // listed the client rebalances eagerly (every partition is revoked, then reassigned).
        props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
                CooperativeStickyAssignor.class.getName() + "," + RoundRobinAssignor.class.getName());
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
            worker.live = false;
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
            Log.info("serving tool " + config.tool() + " from " + config.jobTopic() + " in group " + config.groupId()
                    + ", up to " + config.concurrency() + " jobs at once");
            while (live) {
                control.poll(Duration.ZERO);
                for (ConsumerRecord<byte[], byte[]> record : jobs.poll(pollTimeout())) {
                    take(record);
                }
                startDue();
                advanceAll();
                pauseWhenFull();
            }
        } catch (WakeupException e) {
            // shutting down
        }
        Log.info("stopped");
    }

    private void take(ConsumerRecord<byte[], byte[]> record) {
        TopicPartition tp = new TopicPartition(record.topic(), record.partition());
        unfinished.computeIfAbsent(tp, k -> new TreeSet<>()).add(record.offset());
        readUpTo.merge(tp, record.offset() + 1, Math::max);
        pending.add(new Held(record, 0));
    }

    /** Starts held jobs whose time has come while a slot is free. */
    private void startDue() {
        long now = System.currentTimeMillis();
        for (Iterator<Held> it = pending.iterator(); it.hasNext() && running.size() < config.concurrency(); ) {
            Held held = it.next();
            if (held.notBeforeMs() > now) {
                continue;
            }
            it.remove();
            try {
                CountJob job = CountJob.start(held.record(), this);
                if (job != null) {
                    running.add(job);
                }
            } catch (IllegalStateException e) {
                retryLater(held.record(), e);
            }
        }
    }

    /** Advances every running job by what is due; one that fails on a write is held for a retry. */
    private void advanceAll() {
        for (CountJob job : List.copyOf(running)) {
            try {
                if (job.advance()) {
                    running.remove(job);
                }
            } catch (IllegalStateException e) {
                running.remove(job);
                retryLater(job.record(), e);
            }
        }
    }

    /**
     * A job that could not write is run again from its start after a backoff (its events may
     * repeat: at least once); an error that no retry can cure stops the worker.
     */
    private void retryLater(ConsumerRecord<byte[], byte[]> record, IllegalStateException e) {
        if (e.getCause() instanceof KafkaException cause && isFatal(cause)) {
            throw cause;
        }
        int n = failures.merge(record, 1, Integer::sum);
        long delay = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS << Math.min(n - 1, 16));
        Log.info("a job stops on an error (" + e + "); it runs again in " + delay + " ms");
        pending.addFirst(new Held(record, System.currentTimeMillis() + delay));
    }

    private Duration pollTimeout() {
        long now = System.currentTimeMillis();
        long wait = IDLE_POLL.toMillis();
        for (CountJob job : running) {
            wait = Math.min(wait, job.millisToNextStep());
        }
        if (running.size() < config.concurrency()) {
            for (Held held : pending) {
                wait = Math.min(wait, held.notBeforeMs() - now);
            }
        }
        return Duration.ofMillis(Math.max(0, wait));
    }

    /** A full worker keeps its partitions paused: the member goes on polling, nothing more comes. */
    private void pauseWhenFull() {
        if (running.size() + pending.size() >= config.concurrency()) {
            jobs.pause(jobs.assignment());
        } else if (!jobs.paused().isEmpty()) {
            jobs.resume(jobs.paused());
        }
    }

    /** The offset to commit once the job at {@code offset} has ended: the lowest one still running. */
    private long commitOffsetAfter(TopicPartition tp, long offset) {
        TreeSet<Long> open = unfinished.getOrDefault(tp, new TreeSet<>());
        Long lowestOther = open.stream().filter(o -> o != offset).findFirst().orElse(null);
        return lowestOther != null ? lowestOther : readUpTo.getOrDefault(tp, offset + 1);
    }

    /** Jobs read from partitions that moved away are dropped: their new owner runs them. */
    private final class Rebalance implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            pending.removeIf(h -> partitions.contains(partitionOf(h.record())));
            for (Iterator<CountJob> it = running.iterator(); it.hasNext(); ) {
                CountJob job = it.next();
                if (partitions.contains(job.partition())) {
                    Log.info("task " + Log.id(job.taskId()) + ": its partition moved away, the job stops here");
                    it.remove();
                }
            }
            failures.keySet().removeIf(r -> partitions.contains(partitionOf(r)));
            partitions.forEach(tp -> {
                unfinished.remove(tp);
                readUpTo.remove(tp);
            });
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

    private static TopicPartition partitionOf(ConsumerRecord<byte[], byte[]> record) {
        return new TopicPartition(record.topic(), record.partition());
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

    /**
     * Writes the job's outcome with the partition's next offset to commit. A commit that fails
     * throws {@link IllegalStateException} (the job is held for a retry), or the Kafka error
     * itself when no retry can cure it.
     */
    void finish(String taskId, ObjectNode status, ConsumerRecord<byte[], byte[]> job) {
        TopicPartition tp = partitionOf(job);
        try {
            writer.outcome(taskId, status, tp, commitOffsetAfter(tp, job.offset()), jobs.groupMetadata());
        } catch (KafkaException e) {
            if (isFatal(e)) {
                throw e;
            }
            throw new IllegalStateException("the outcome of task " + Log.id(taskId) + " was not committed", e);
        }
        TreeSet<Long> open = unfinished.get(tp);
        if (open != null) {
            open.remove(job.offset());
        }
        failures.remove(job);
        Log.info("task " + Log.id(taskId) + ": " + (status == null ? "skipped" : status.path("status").asText()));
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
