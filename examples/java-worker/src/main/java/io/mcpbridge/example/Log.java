package io.mcpbridge.example;

import java.time.Instant;

/** One line per fact on stderr; task ids are shortened, they are not secrets but they are long. */
final class Log {
    private Log() {}

    static void info(String line) {
        System.err.println(Instant.now() + " java-worker: " + line);
    }

    /**
     * The first 8 characters of a task id, enough to follow one task in the log. Any writer of a
     * topic picks its keys, so control and format characters become {@code ?}: a key cannot
     * forge a log line.
     */
    static String id(String taskId) {
        String head = taskId.length() <= 8 ? taskId : taskId.substring(0, 8);
        StringBuilder out = new StringBuilder(head.length() + 1);
        for (int i = 0; i < head.length(); i++) {
            char c = head.charAt(i);
            int type = Character.getType(c);
            boolean unsafe = Character.isISOControl(c) || type == Character.FORMAT
                    || type == Character.LINE_SEPARATOR || type == Character.PARAGRAPH_SEPARATOR
                    || Character.isSurrogate(c);
            out.append(unsafe ? '?' : c);
        }
        return taskId.length() <= 8 ? out.toString() : out + "…";
    }
}
