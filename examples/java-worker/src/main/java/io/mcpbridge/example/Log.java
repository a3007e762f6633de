package io.mcpbridge.example;

import java.time.Instant;

/** One line per fact on stderr; task ids are shortened, they are not secrets but they are long. */
final class Log {
    private Log() {}

    static void info(String line) {
        System.err.println(Instant.now() + " java-worker: " + line);
    }

    /** The first 8 characters of a task id, enough to follow one task in the log. */
    static String id(String taskId) {
        return taskId.length() <= 8 ? taskId : taskId.substring(0, 8) + "…";
    }
}
