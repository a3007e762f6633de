// The bridge's task view (docs/browser.md): one task's timeline, live, from the plain SSE
// endpoint. Every text from the task (types, payloads, results) goes into the page through
// textContent, never as HTML. The view token arrives in the URL fragment (never sent to a
// server); it is moved to this tab's sessionStorage and taken out of the address bar and
// history at once.
"use strict";

(function () {
  const STORE = "mcp-kafka-bridge.view"; // sessionStorage: this tab only, gone when it closes
  const $ = (id) => document.getElementById(id);
  // Faults that pass (docs/tasks-stream.md §4.3): the stream ends and the browser resumes.
  const RETRIABLE = new Set([
    "partition_moving",
    "owner_unavailable",
    "kafka_unavailable",
    "draining",
    "wait_ended",
  ]);
  let current = null; // {task, token}
  let source = null;
  let lastSeq = -1; // the highest seq shown: anything at or below it is a duplicate
  let finished = false;
  let duplicates = 0;

  function setState(state, text) {
    document.body.dataset.state = state;
    $("connection").textContent = text;
  }

  function banner(text, earliestSeq) {
    $("banner-text").textContent = text;
    $("banner").hidden = false;
    const button = $("banner-continue");
    button.hidden = earliestSeq === undefined || earliestSeq === null;
    button.onclick = () => {
      $("banner").hidden = true;
      lastSeq = Math.max(lastSeq, earliestSeq - 1);
      open(earliestSeq - 1);
    };
  }

  function showStatus(status) {
    if (typeof status === "string") $("status").textContent = status;
  }

  function showState(state) {
    showStatus(state.status);
    let title = null;
    let body;
    if (state.status === "completed") {
      title = "Result";
      body = state.result;
    } else if (state.status === "failed") {
      title = "Error";
      body = state.error;
    } else if (state.status === "cancelled") {
      title = "Cancelled";
      body = state.statusMessage || "the task was cancelled";
    }
    if (title === null) return;
    $("result-title").textContent = title;
    $("result-text").textContent = typeof body === "string" ? body : JSON.stringify(body, null, 2);
    $("result").className = state.status === "completed" ? "" : "failed";
    $("result").hidden = false;
  }

  function addEvent(event) {
    if (typeof event.seq !== "number") return;
    if (event.seq <= lastSeq) {
      // A duplicate (a resume is exact, so none is expected): dropped, and counted to show.
      duplicates += 1;
      document.body.dataset.duplicates = String(duplicates);
      return;
    }
    lastSeq = event.seq;
    const row = document.createElement("tr");
    row.dataset.seq = String(event.seq);
    for (const [cls, text] of [
      ["seq", String(event.seq)],
      ["time", String(event.time)],
      ["type", String(event.type)],
      ["payload", JSON.stringify(event.payload)],
    ]) {
      const cell = document.createElement("td");
      cell.className = cls;
      cell.textContent = text; // text, never markup
      row.appendChild(cell);
    }
    $("events").appendChild(row);
    if (/\.task\.status$/.test(event.type) && event.payload) showStatus(event.payload.status);
  }

  function base() {
    return "/view/tasks/" + encodeURIComponent(current.task);
  }

  function query() {
    return "?token=" + encodeURIComponent(current.token);
  }

  async function fetchState() {
    const reply = await fetch(base() + query(), { cache: "no-store", credentials: "omit" });
    const body = await reply.json().catch(() => ({}));
    if (!reply.ok) throw new Error(body.error || "HTTP " + reply.status);
    return body;
  }

  function close(state, text) {
    if (source !== null) source.close(); // else EventSource reconnects forever
    source = null;
    setState(state, text);
  }

  function open(after) {
    if (source !== null) source.close();
    finished = false;
    let url = base() + "/events" + query();
    if (after !== undefined && after !== null && after >= 0) url += "&after=" + after;
    source = new EventSource(url);
    setState("connecting", "connecting");
    source.onopen = () => setState("live", "live");
    source.onmessage = (message) => addEvent(JSON.parse(message.data));
    source.addEventListener("end", (message) => {
      finished = true;
      close("ended", "ended");
      showState(JSON.parse(message.data));
    });
    source.addEventListener("gone", (message) => {
      const data = JSON.parse(message.data);
      close("gone", "events gone");
      banner(
        "Events before seq " + data.earliestSeq + " are no longer retained (events_gone).",
        data.earliestSeq,
      );
    });
    source.addEventListener("expired", () => {
      // The view token ran out: a reconnect would be refused, so stop and say so.
      finished = true;
      close("expired", "link expired");
      banner("The view link expired: ask for a new one. The events shown stay on the page.");
    });
    source.addEventListener("fault", (message) => {
      const data = JSON.parse(message.data);
      if (RETRIABLE.has(data.reason)) {
        // The stream ends next and the browser resumes with Last-Event-ID (docs/browser.md).
        setState("reconnecting", "reconnecting");
        return;
      }
      close("failed", "failed");
      banner("The stream failed: " + data.message);
    });
    source.onerror = () => {
      if (finished || source === null) return;
      if (source.readyState === EventSource.CLOSED) {
        // Refused (not an event stream): ask the state endpoint why, once.
        close("failed", "closed");
        fetchState().then(showState, (error) => banner("Cannot open the task: " + error.message));
      } else {
        setState("reconnecting", "reconnecting"); // the browser resumes with Last-Event-ID
      }
    };
  }

  function start(view) {
    current = view;
    $("task-id").textContent = view.task;
    $("open").hidden = true;
    fetchState().then(showState, (error) => banner("Cannot open the task: " + error.message));
    open();
  }

  function fromFragment() {
    const params = new URLSearchParams(location.hash.slice(1));
    const task = params.get("task");
    const token = params.get("token");
    if (task && token) {
      sessionStorage.setItem(STORE, JSON.stringify({ task, token }));
      history.replaceState(null, "", location.pathname + location.search);
      return { task, token };
    }
    const saved = sessionStorage.getItem(STORE);
    return saved ? JSON.parse(saved) : null;
  }

  async function mint(event) {
    event.preventDefault();
    const task = $("open-task").value.trim();
    const bearer = $("open-bearer").value;
    $("open-bearer").value = ""; // used for this one request only
    const headers = { "Content-Type": "application/json" };
    if (bearer) headers.Authorization = "Bearer " + bearer;
    const reply = await fetch("/view/token", {
      method: "POST",
      headers,
      body: JSON.stringify({ taskId: task }),
      cache: "no-store",
      credentials: "omit",
    });
    const body = await reply.json().catch(() => ({}));
    if (!reply.ok) {
      banner("Cannot open the task: " + (body.error || "HTTP " + reply.status));
      return;
    }
    sessionStorage.setItem(STORE, JSON.stringify({ task, token: body.token }));
    start({ task, token: body.token });
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("open-form").addEventListener("submit", mint);
    const view = fromFragment();
    if (view === null) {
      $("open").hidden = false;
    } else {
      start(view);
    }
  });
})();
