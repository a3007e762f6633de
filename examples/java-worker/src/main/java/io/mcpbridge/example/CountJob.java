package io.mcpbridge.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * One run of a {@code java_count} job, advanced by the worker's loop one step at a time.
 *
 * <p>Before every step it looks at what the control topic says of its task: a {@code finished}
 * mark (another copy ended it) stops it without a write, a {@code cancel} ends it cancelled.
 */
final class CountJob {

    static final String INPUT_KEY = "confirm";
    static final int MAX_COUNT = 10_000;
    /** The wording of docs/workers.md, the same as the Python SDK's. */
    static final String CANCELLED = "cancelled at the client's request";
    static final String CANCELLED_BEFORE_START = "cancelled before it started";
    static final String EXPIRED = "the task expired before its job ended";

    private final CountWorker worker;
    private final ConsumerRecord<byte[], byte[]> record;
    private final String taskId;
    private final int count;
    private final boolean confirm;
    private final long stepMs;
    /** createdMs + ttlMs: past it nobody can read the task (Long.MAX_VALUE: no TTL given). */
    private final long expiresAtMs;
    private int n;
    private long nextStepAtMs;
    private boolean waiting;
    private String confirmation;

    private CountJob(CountWorker worker, ConsumerRecord<byte[], byte[]> record, String taskId, int count, boolean confirm,
            long expiresAtMs) {
        this.worker = worker;
        this.expiresAtMs = expiresAtMs;
        this.record = record;
        this.taskId = taskId;
        this.count = count;
        this.confirm = confirm;
        this.stepMs = worker.config().stepMs();
        this.nextStepAtMs = System.currentTimeMillis() + stepMs;
    }

    /** Reads the job request: a job to run, or null when it ended here (skipped, cancelled, refused). */
    static CountJob start(ConsumerRecord<byte[], byte[]> record, CountWorker worker) {
        String key = CountWorker.keyOf(record);
        JsonNode request = readJson(record.value(), worker);
        if (request == null || !request.isObject()) {
            if (key == null || key.isEmpty()) {
                Log.info("an unreadable job request without a key at offset " + record.offset() + " is skipped");
                worker.finish("(no key)", null, record);
            } else {
                worker.finish(key, failed(worker, -32603, "the job request could not be read"), record);
            }
            return null;
        }
        JsonNode taskIdNode = request.path("taskId");
        if (key == null || key.isEmpty() || !taskIdNode.isTextual() || !taskIdNode.asText().equals(key)) {
            // The contract: taskId is a string equal to the key. Anything else is a job request
            // that cannot be read; its key's task (when it has one) ends failed, never working.
            if (key == null || key.isEmpty()) {
                Log.info("a job request without a key at offset " + record.offset() + " is skipped");
                worker.finish("(no key)", null, record);
            } else {
                worker.finish(key, failed(worker, -32603, "the job request could not be read"), record);
            }
            return null;
        }
        String taskId = key;
        ControlState.Task known = worker.control().of(taskId);
        if (known.finished) {
            Log.info("task " + Log.id(taskId) + ": already finished, the job is skipped");
            worker.finish(taskId, null, record);
            return null;
        }
        String tool = request.path("tool").asText("");
        if (!tool.equals(worker.config().tool())) {
            worker.finish(taskId, failed(worker, -32603, "no handler for tool " + tool), record);
            return null;
        }
        if (known.cancelled) {
            worker.finish(taskId, cancelled(worker, CANCELLED_BEFORE_START), record);
            return null;
        }
        long expiresAtMs = expiry(request);
        if (System.currentTimeMillis() >= expiresAtMs) {
            Log.info("task " + Log.id(taskId) + ": expired before its job started");
            worker.finish(taskId, failed(worker, -32603, EXPIRED), record);
            return null;
        }
        JsonNode arguments = request.path("arguments");
        JsonNode countNode = arguments.path("count");
        if (!countNode.canConvertToInt() || !countNode.isIntegralNumber()
                || countNode.asInt() < 1 || countNode.asInt() > MAX_COUNT) {
            worker.finish(taskId, failed(worker, -32602, "arguments.count must be an integer from 1 to " + MAX_COUNT), record);
            return null;
        }
        boolean confirm = arguments.path("confirm").asBoolean(false);
        Log.info("task " + Log.id(taskId) + ": counting to " + countNode.asInt() + (confirm ? ", confirming halfway" : ""));
        return new CountJob(worker, record, taskId, countNode.asInt(), confirm, expiresAtMs);
    }

    /** createdMs + ttlMs of the job request, when it gives both (an addition to contract v1). */
    private static long expiry(JsonNode request) {
        JsonNode created = request.path("createdMs");
        JsonNode ttl = request.path("ttlMs");
        if (!created.isIntegralNumber() || !ttl.isIntegralNumber() || !created.canConvertToLong()
                || !ttl.canConvertToLong() || ttl.asLong() < 1) {
            return Long.MAX_VALUE;
        }
        long sum = created.asLong() + ttl.asLong();
        return sum < created.asLong() ? Long.MAX_VALUE : sum; // an overflow means: never
    }

    String taskId() {
        return taskId;
    }

    ConsumerRecord<byte[], byte[]> record() {
        return record;
    }

    TopicPartition partition() {
        return new TopicPartition(record.topic(), record.partition());
    }

    long millisToNextStep() {
        long next = waiting ? expiresAtMs : Math.min(nextStepAtMs, expiresAtMs);
        return next == Long.MAX_VALUE ? Long.MAX_VALUE : next - System.currentTimeMillis();
    }

    /** Does what is due now; true once the job has ended (or stopped). */
    boolean advance() {
        ControlState.Task known = worker.control().of(taskId);
        if (known.finished) {
            Log.info("task " + Log.id(taskId) + ": another copy finished it, this one stops");
            worker.finish(taskId, null, record);
            return true;
        }
        if (known.cancelled) {
            worker.finish(taskId, cancelled(worker, CANCELLED), record);
            return true;
        }
        if (System.currentTimeMillis() >= expiresAtMs) {
            // Nobody can read the task any more (a client that left an input request open, a
            // job longer than its TTL): stop, so that it holds no slot for ever.
            Log.info("task " + Log.id(taskId) + ": expired, the job stops");
            worker.finish(taskId, failed(worker, -32603, EXPIRED), record);
            return true;
        }
        if (waiting) {
            return resumeOnAnswer(known);
        }
        if (System.currentTimeMillis() < nextStepAtMs) {
            return false;
        }
        if (confirm && confirmation == null && n == count / 2) {
            return ask(known);
        }
        n++;
        worker.emit(taskId, worker.config().eventType("progress"), progress());
        worker.emit(taskId, "com.example.count.tick", worker.json().createObjectNode().put("n", n));
        if (n == count) {
            worker.finish(taskId, completed(), record);
            return true;
        }
        nextStepAtMs += stepMs;
        return false;
    }

    /** Asks once per key over the task's life: an answer given to an earlier attempt is reused. */
    private boolean ask(ControlState.Task known) {
        JsonNode earlier = known.answers.get(INPUT_KEY);
        if (earlier != null) {
            return decide(earlier);
        }
        ObjectNode schema = worker.json().createObjectNode().put("type", "object");
        schema.putObject("properties").putObject(INPUT_KEY)
                .put("type", "boolean")
                .put("description", "true to go on counting");
        schema.putArray("required").add(INPUT_KEY);
        ObjectNode status = worker.json().createObjectNode()
                .put("status", "input_required")
                .put("statusMessage", "halfway (" + n + " of " + count + "): waiting for confirmation");
        ObjectNode params = status.putObject("inputRequests").putObject(INPUT_KEY)
                .put("method", "elicitation/create")
                .putObject("params");
        params.put("message", "Counted " + n + " of " + count + ". Go on?");
        params.set("requestedSchema", schema);
        worker.emit(taskId, worker.config().eventType("task.status"), status);
        waiting = true;
        Log.info("task " + Log.id(taskId) + ": asked for confirmation");
        return false;
    }

    private boolean resumeOnAnswer(ControlState.Task known) {
        JsonNode answer = known.answers.get(INPUT_KEY);
        if (answer == null) {
            return false;
        }
        waiting = false;
        nextStepAtMs = System.currentTimeMillis() + stepMs;
        return decide(answer);
    }

    /** Accepted with confirm true: go on; anything else ends the count where it is. */
    private boolean decide(JsonNode answer) {
        boolean yes = "accept".equals(answer.path("action").asText())
                && answer.path("content").path(INPUT_KEY).asBoolean(false);
        confirmation = yes ? "confirmed" : "declined";
        Log.info("task " + Log.id(taskId) + ": " + confirmation);
        if (yes) {
            return false;
        }
        worker.finish(taskId, completed(), record);
        return true;
    }

    private ObjectNode progress() {
        return worker.json().createObjectNode()
                .put("progress", n)
                .put("total", count)
                .put("message", "counted " + n + " of " + count);
    }

    private ObjectNode completed() {
        ObjectNode status = worker.json().createObjectNode().put("status", "completed");
        ObjectNode result = status.putObject("result");
        result.putArray("content").addObject()
                .put("type", "text")
                .put("text", "Counted to " + n + " of " + count + ".");
        result.putObject("structuredContent")
                .put("count", n)
                .put("confirmation", confirmation == null ? "not asked" : confirmation);
        return status;
    }

    /**
     * The cancelled status, in the contract's fixed wording: a {@code statusMessage} on the
     * cancel message is ignored, since any writer of the control topic could put words there.
     */
    private static ObjectNode cancelled(CountWorker worker, String wording) {
        return worker.json().createObjectNode()
                .put("status", "cancelled")
                .put("statusMessage", wording);
    }

    private static ObjectNode failed(CountWorker worker, int code, String message) {
        ObjectNode status = worker.json().createObjectNode().put("status", "failed");
        status.putObject("error").put("code", code).put("message", message);
        return status;
    }

    private static JsonNode readJson(byte[] value, CountWorker worker) {
        if (value == null) {
            return null;
        }
        try {
            return worker.json().readTree(value);
        } catch (java.io.IOException e) {
            return null;
        }
    }
}
