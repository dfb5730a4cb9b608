// The operator's page: a runs list with filters, a run's page with its
// phase timeline, what it waits for, and the actions on it, and the
// schedules with theirs. It talks
// to the same API as any client, with the same bearer token.
"use strict";

const base = location.pathname.replace(/\/ui\/.*$/, "");
const app = document.getElementById("app");
const statuses = ["", "pending", "running", "waiting", "compensating", "succeeded", "failed", "cancelled", "compensated"];
const reasons = ["", "executing", "due", "backing_off", "timer", "signal", "unserved", "compensating", "compensation_stuck", "needs_reconciliation", "concurrency", "queued", "rate_limited", "child", "cancel_pending"];
let poll = null;
let lastAction = ""; // what the last action on the run page answered
let armedCancel = null; // the run whose Cancel button was clicked once: a second click cancels it

// h builds an element: h("td", {class: "x"}, "text", child, ...).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function token() { return sessionStorage.getItem("ratchet-token") || ""; }

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("ratchet-token", document.getElementById("token").value.trim());
  route();
});

class APIError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || ("HTTP " + status));
    this.status = status;
    this.code = problem.code;
  }
}

async function api(method, path, {body, headers} = {}) {
  const init = {method, headers: Object.assign({}, headers)};
  if (token()) init.headers.Authorization = "Bearer " + token();
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const resp = await fetch(base + path, init);
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!resp.ok) throw new APIError(resp.status, data || {});
  return data;
}

function badge(text) { return h("span", {class: "badge " + text, "data-badge": text}, text.replace(/_/g, " ")); }

function fmtTime(t) { return t ? new Date(t).toLocaleString() : "—"; }

function fmtDuration(ms) {
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  if (ms < 3600000) return Math.round(ms / 60000) + " min";
  return (ms / 3600000).toFixed(1) + " h";
}

function showError(err) {
  if (err instanceof APIError && err.status === 401) {
    return h("div", {class: "notice", id: "error"}, "The API wants a bearer token: enter one above.");
  }
  return h("div", {class: "notice", id: "error"}, "Could not load: " + err.message);
}

function stopPolling() { if (poll) { clearInterval(poll); poll = null; } }

// ---- the runs list ----

function filtersFromHash() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

async function renderList() {
  const f = filtersFromHash();
  const field = (name, label, input) => h("label", {}, label, input);
  const select = (name, values) => h("select", {name, id: "filter-" + name},
    values.map((v) => h("option", {value: v, selected: f.get(name) === v}, v === "" ? "any" : v.replace(/_/g, " "))));
  const text = (name, placeholder) => h("input", {name, id: "filter-" + name, value: f.get(name) || "", placeholder});
  const form = h("form", {class: "filters", id: "filters", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value) q.set(el.name, el.value);
    location.hash = "#/?" + q.toString();
  }},
    field("status", "Status", select("status", statuses)),
    field("blocked", "Blocked by", select("blocked", reasons)),
    field("workflow", "Workflow", text("workflow", "payment")),
    field("idempotency_key", "Idempotency key", text("idempotency_key", "order-1")),
    field("child_key", "Child key", text("child_key", "rk1_…")),
    h("button", {type: "submit", id: "apply"}, "Filter"),
    h("button", {type: "button", class: "secondary", onclick: () => { location.hash = "#/"; }}, "Clear"));
  const table = h("div", {id: "runs"}, h("p", {class: "muted"}, "Loading…"));
  app.replaceChildren(form, table);

  const load = async () => {
    const q = new URLSearchParams(f);
    q.set("limit", "50");
    try {
      const page = await api("GET", "/v1/runs?" + q.toString());
      table.replaceChildren(runsTable(page.data || []), page.next
        ? h("p", {}, h("a", {href: "#/?" + withAfter(f, page.next)}, "Older runs →")) : "");
    } catch (err) {
      table.replaceChildren(showError(err));
    }
  };
  await load();
  poll = setInterval(load, 3000);
}

function withAfter(f, after) { const q = new URLSearchParams(f); q.set("after", after); return q.toString(); }

function runsTable(runs) {
  if (runs.length === 0) return h("p", {class: "muted", id: "empty"}, "No runs match.");
  return h("table", {},
    h("thead", {}, h("tr", {}, ["Run", "Workflow", "Status", "Blocked by", "Idempotency key", "Created"].map((t) => h("th", {}, t)))),
    h("tbody", {}, runs.map((r) => h("tr", {class: "run-row", dataset: {id: r.id, status: r.status, blocked: r.blocked ? r.blocked.reason : ""}},
      h("td", {class: "id"}, h("a", {href: "#/runs/" + r.id}, r.id)),
      h("td", {}, r.workflow + "@" + r.workflow_version),
      h("td", {}, badge(r.status)),
      h("td", {title: r.blocked ? r.blocked.detail : ""}, r.blocked ? badge(r.blocked.reason) : h("span", {class: "muted"}, "—")),
      h("td", {class: "mono"}, r.idempotency_key),
      h("td", {title: "updated " + fmtTime(r.updated_at)}, fmtTime(r.created_at))))));
}

// ---- a run's page ----

async function renderRun(id) {
  const holder = h("div", {id: "run"}, h("p", {class: "muted"}, "Loading…"));
  app.replaceChildren(h("p", {}, h("a", {href: "#/"}, "← all runs")), holder);
  const load = async () => {
    try {
      const run = await api("GET", "/v1/runs/" + encodeURIComponent(id));
      const restore = keepDraft();
      holder.replaceChildren(...runView(run, load));
      restore();
      if (run.finished_at) stopPolling();
    } catch (err) {
      holder.replaceChildren(showError(err));
      stopPolling();
    }
  };
  await load();
  poll = setInterval(load, 3000);
}

// keepDraft remembers what is typed into the run page's signal form, and
// where the caret is, and returns what puts it back: the page re-renders
// on every poll, which would otherwise wipe a signal half typed.
function keepDraft() {
  const ids = ["signal-name", "signal-event", "signal-payload"];
  const values = ids.map((id) => [id, document.getElementById(id)]).filter(([, el]) => el).map(([id, el]) => [id, el.value]);
  const active = document.activeElement;
  const caret = active && ids.includes(active.id) ? {id: active.id, start: active.selectionStart, end: active.selectionEnd} : null;
  return () => {
    for (const [id, value] of values) {
      const el = document.getElementById(id);
      if (el) el.value = value;
    }
    const el = caret && document.getElementById(caret.id);
    if (el) {
      el.focus();
      el.setSelectionRange(caret.start, caret.end);
    }
  };
}

function runView(run, reload) {
  const out = [];
  out.push(h("div", {class: "card"},
    h("h2", {}, run.workflow + "@" + run.workflow_version + " ", badge(run.status)),
    h("div", {class: "grid"},
      h("span", {class: "muted"}, "Run"), h("span", {class: "mono", id: "run-id"}, run.id),
      h("span", {class: "muted"}, "Idempotency key"), h("span", {class: "mono"}, run.idempotency_key),
      h("span", {class: "muted"}, "Recovery point"), h("span", {}, run.recovery_point),
      h("span", {class: "muted"}, "Executions"), h("span", {id: "executions"}, run.attempt + ", " + (run.failures || 0) + " failed" +
        (run.error_streak ? " (" + run.error_streak + " in a row with the same error)" : "")),
      h("span", {class: "muted"}, "Created"), h("span", {}, fmtTime(run.created_at)),
      h("span", {class: "muted"}, "Finished"), h("span", {}, fmtTime(run.finished_at)),
      run.pivot ? [h("span", {class: "muted"}, "Pivot"), h("span", {}, run.pivot + " (committed: it only goes forward)")] : [],
      run.concurrency ? [h("span", {class: "muted"}, "Concurrency"), h("span", {id: "concurrency"},
        h("span", {class: "mono"}, run.concurrency.key), " · limit " + run.concurrency.limit +
        (run.finished_at ? "" : run.concurrency.holds_slot ? " · holds a slot" : " · holds no slot"))] : [],
      run.queue ? [h("span", {class: "muted"}, "Queue"), h("span", {id: "queue"},
        h("span", {class: "mono"}, run.queue.name), " · priority " + run.queue.priority +
        (run.queue.started_at ? " · started " + fmtTime(run.queue.started_at) : " · waiting in it"))] : [],
      run.parent_run_id ? [h("span", {class: "muted"}, "Parent"), h("span", {id: "parent"},
        h("a", {class: "mono", href: "#/runs/" + run.parent_run_id}, run.parent_run_id))] : [],
      run.children && run.children.length ? [h("span", {class: "muted"}, "Children"), h("span", {id: "children"},
        run.children.flatMap((c, i) => [i ? ", " : "", h("a", {class: "mono", href: "#/runs/" + c.id, dataset: {status: c.status}}, c.id), " " + c.workflow + " ", badge(c.status)]))] : []),
    whyBox(run),
    actions(run, reload),
    h("p", {id: "action-result", class: "muted"}, lastAction)));
  out.push(h("div", {class: "card"}, h("h3", {}, "Timeline"), timeline(run)));
  const blocks = [];
  if (run.input !== undefined) blocks.push(h("h4", {}, "Input"), h("pre", {id: "input"}, JSON.stringify(run.input, null, 2)));
  if (run.output !== undefined) blocks.push(h("h4", {}, "Output"), h("pre", {id: "output"}, JSON.stringify(run.output, null, 2)));
  if (run.error) blocks.push(h("h4", {}, "Error"), h("pre", {id: "run-error", class: "error"}, run.error.code + ": " + run.error.message));
  if (run.waiting_for) blocks.push(h("h4", {}, "Waiting for"), h("pre", {id: "waiting-for"}, JSON.stringify(run.waiting_for, null, 2)));
  if (blocks.length) out.push(h("div", {class: "card"}, blocks));
  return out;
}

function whyBox(run) {
  if (!run.blocked) return h("div", {class: "why none", id: "why"}, "Finished " + run.status + ": nothing moves it any more.");
  const b = run.blocked;
  return h("div", {class: "why", id: "why", dataset: {reason: b.reason}},
    badge(b.reason), " ", b.detail,
    b.since ? h("div", {class: "muted"}, "since " + fmtTime(b.since)) : "",
    b.until ? h("div", {class: "muted"}, "until " + fmtTime(b.until)) : "",
    b.holders && b.holders.length ? h("div", {id: "holders"}, "Held by ",
      b.holders.flatMap((id, i) => [i ? ", " : "", h("a", {class: "mono", href: "#/runs/" + id}, id)])) : "");
}

function actions(run, reload) {
  if (run.finished_at && run.status !== "failed") return "";
  const act = (fn) => async (e) => {
    e.target.disabled = true;
    try {
      lastAction = await fn();
    } catch (err) {
      lastAction = "Failed: " + err.message;
    }
    e.target.disabled = false;
    const shown = document.getElementById("action-result");
    if (shown) shown.textContent = lastAction;
    if (!armedCancel) await reload();
  };
  const buttons = [];
  if (!run.finished_at) {
    const armed = armedCancel === run.id;
    const cancel = h("button", {class: "danger", id: "cancel", dataset: armed ? {armed: "1"} : {}, onclick: act(async () => {
      if (armedCancel !== run.id) { // a second click confirms
        armedCancel = run.id;
        cancel.dataset.armed = "1";
        cancel.textContent = "Really cancel?";
        return "Click again to cancel the run.";
      }
      armedCancel = null;
      const r = await api("POST", "/v1/runs/" + run.id + "/cancel");
      return {cancelled: "Cancelled.", compensates: "Cancelling: it undoes what it did first.", requested: "Cancellation requested: the executor stops at its next phase."}[r.cancellation] || r.cancellation;
    })}, armed ? "Really cancel?" : "Cancel");
    buttons.push(cancel);
  }
  const parked = run.waiting_for && (run.waiting_for.kind === "compensation" || run.waiting_for.kind === "reconcile");
  if (run.status === "failed" || parked) {
    buttons.push(h("button", {id: "resume", onclick: act(async () => { await api("POST", "/v1/runs/" + run.id + "/resume"); return "Resumed."; })}, "Resume"));
  }
  if (!run.finished_at) {
    const name = h("input", {id: "signal-name", placeholder: "signal", value: run.waiting_for && run.waiting_for.kind === "signal" ? run.waiting_for.phase : ""});
    const event = h("input", {id: "signal-event", placeholder: "event id"});
    const payload = h("input", {id: "signal-payload", placeholder: "payload (JSON)", value: "{}"});
    buttons.push(name, event, payload, h("button", {class: "secondary", id: "signal", onclick: act(async () => {
      if (!name.value || !event.value) throw new Error("a signal needs a name and an event id");
      const r = await api("POST", "/v1/runs/" + run.id + "/signals/" + encodeURIComponent(name.value),
        {body: payload.value, headers: {"Idempotency-Key": event.value}});
      event.value = ""; // sent: the next signal needs an event id of its own
      return r.delivered ? "Signal delivered." : "Signal kept until the run awaits it.";
    })}, "Send signal"));
  }
  return h("div", {class: "actions"}, buttons);
}

function timeline(run) {
  const phases = run.phases || [];
  const t0 = Date.parse(run.created_at);
  const ends = phases.map((p) => Date.parse(p.finished_at));
  const end = run.finished_at ? Math.max(Date.parse(run.finished_at), ...ends) : Math.max(Date.now(), ...ends);
  const span = Math.max(end - t0, 1);
  const pct = (t) => (100 * (t - t0) / span).toFixed(3) + "%";
  const rows = phases.map((p, i) => {
    // A waiting phase commits when the wait ends: its bar spans the wait,
    // from the end of the phase before it.
    const waits = p.kind === "sleep" || p.kind === "signal";
    const start = waits ? (i > 0 ? Date.parse(phases[i - 1].finished_at) : t0) : Date.parse(p.started_at);
    const stop = Date.parse(p.finished_at);
    const cls = "tl-bar " + p.kind + (p.status === "failed" ? " failed" : "");
    const meta = fmtDuration(stop - start) + " · " + p.attempts + (p.attempts === 1 ? " attempt" : " attempts");
    // Committed by one execution of the run; every later one replayed it
    // from the journal instead of running it again.
    const origin = p.execution ? "committed by execution " + p.execution +
      (p.replayed ? ", replayed by the " + (run.attempt - p.execution === 1 ? "next execution" : (run.attempt - p.execution) + " executions after it") : "") : "";
    return h("div", {class: "tl-row phase-row", dataset: {name: p.name, kind: p.kind, replayed: p.replayed ? "1" : "0"}},
      h("div", {class: "tl-name", title: [p.child_key ? "child key " + p.child_key : p.name, origin].filter(Boolean).join("\n")},
        h("strong", {}, p.name), " ", h("span", {class: "muted"}, p.kind), p.status === "failed" ? [" ", badge("failed")] : "",
        p.replayed ? [" ", h("span", {class: "replayed", title: origin}, "↻ replayed")] : "",
        p.child_key ? h("div", {class: "mono muted"}, p.child_key) : ""),
      h("div", {class: "tl-track"}, h("div", {class: cls, style: "left:" + pct(start) + ";width:" + pct(t0 + Math.max(stop - start, 0))})),
      h("div", {class: "tl-meta", title: origin}, "+" + fmtDuration(start - t0) + " · " + meta + (p.execution ? " · exec " + p.execution : "")));
  });
  if (!run.finished_at && run.waiting_for) {
    const from = phases.length ? Date.parse(phases[phases.length - 1].finished_at) : t0;
    rows.push(h("div", {class: "tl-row phase-row", dataset: {name: run.waiting_for.phase, kind: "wait"}},
      h("div", {class: "tl-name"}, h("strong", {}, run.waiting_for.phase), " ", h("span", {class: "muted"}, "waiting (" + run.waiting_for.kind + ")")),
      h("div", {class: "tl-track"}, h("div", {class: "tl-bar wait", style: "left:" + pct(from) + ";width:" + pct(t0 + Math.max(end - from, 0))})),
      h("div", {class: "tl-meta"}, "since +" + fmtDuration(from - t0) + (run.waiting_for.until ? " · until " + fmtTime(run.waiting_for.until) : ""))));
  }
  if (rows.length === 0) return h("p", {class: "muted"}, "No phase committed yet.");
  const legend = h("div", {class: "legend"}, [["atomic", "var(--accent)"], ["step", "#0e9384"], ["wait", "var(--wait)"], ["compensation", "var(--bad)"], ["patch", "#98a2b3"]]
    .map(([k, c]) => h("span", {}, h("i", {style: "background:" + c}), k)));
  return h("div", {class: "timeline", id: "timeline"}, legend, rows);
}

// ---- schedules ----

// triggerKey is the idempotency key of the next trigger of a schedule:
// kept until a trigger is answered, so that a click retried after a lost
// answer starts no second run.
const triggerKeys = {};
function triggerKey(name) {
  if (!triggerKeys[name]) triggerKeys[name] = "ui-" + Date.now().toString(36) + "-" + Math.random().toString(36).slice(2, 10);
  return triggerKeys[name];
}

async function renderSchedules() {
  const holder = h("div", {id: "schedules"}, h("p", {class: "muted"}, "Loading…"));
  const result = h("p", {id: "schedule-result", class: "muted"}, lastAction);
  app.replaceChildren(h("h2", {}, "Schedules"), holder, result);
  const act = (fn) => async (e) => {
    e.target.disabled = true;
    try {
      lastAction = await fn();
    } catch (err) {
      lastAction = "Failed: " + err.message;
    }
    result.textContent = lastAction;
    await load();
  };
  const load = async () => {
    try {
      const page = await api("GET", "/v1/schedules");
      holder.replaceChildren(schedulesTable(page.data || [], act));
    } catch (err) {
      holder.replaceChildren(showError(err));
    }
  };
  await load();
  poll = setInterval(load, 3000);
}

function schedulesTable(schedules, act) {
  if (schedules.length === 0) return h("p", {class: "muted", id: "empty"}, "No schedules. Put one with PUT /v1/schedules/{name} or ratchet schedules put.");
  const timing = (s) => s.cron ? s.cron + " (" + (s.time_zone || "UTC") + ")" : "every " + fmtDuration(s.every * 1000);
  return h("table", {},
    h("thead", {}, h("tr", {}, ["Schedule", "Timing", "Workflow", "Next tick", "Started", "Skipped", "Last run", "Policies", ""].map((t) => h("th", {}, t)))),
    h("tbody", {}, schedules.map((s) => h("tr", {class: "schedule-row", dataset: {name: s.name, paused: s.paused ? "1" : "0"}},
      h("td", {class: "mono"}, s.name),
      h("td", {class: "mono"}, timing(s)),
      h("td", {}, s.workflow),
      h("td", {}, s.paused ? badge("paused") : fmtTime(s.next_tick_at)),
      h("td", {}, s.started),
      h("td", {}, s.skipped),
      h("td", {class: "id"}, s.last_run_id ? h("a", {href: "#/runs/" + s.last_run_id, class: "last-run"}, s.last_run_id) : h("span", {class: "muted"}, "—")),
      h("td", {class: "muted"}, "catch-up " + s.catch_up + " · overlap " + s.overlap),
      h("td", {},
        h("button", {class: "secondary toggle", onclick: act(async () => {
          await api("POST", "/v1/schedules/" + encodeURIComponent(s.name) + (s.paused ? "/resume" : "/pause"));
          return s.paused ? "Resumed " + s.name + "." : "Paused " + s.name + ".";
        })}, s.paused ? "Resume" : "Pause"),
        " ",
        h("button", {class: "trigger", onclick: act(async () => {
          const r = await api("POST", "/v1/schedules/" + encodeURIComponent(s.name) + "/trigger", {headers: {"Idempotency-Key": triggerKey(s.name)}});
          delete triggerKeys[s.name];
          return "Triggered " + s.name + ": run " + r.id + " (" + r.status + ").";
        })}, "Trigger now"))))));
}

// ---- routing ----

function route() {
  stopPolling();
  lastAction = "";
  armedCancel = null;
  const m = location.hash.match(/^#\/runs\/([^?]+)/);
  document.getElementById("token").value = token();
  if (m) renderRun(decodeURIComponent(m[1]));
  else if (location.hash.startsWith("#/schedules")) renderSchedules();
  else renderList();
}

window.addEventListener("hashchange", route);
route();
