// rmq console: plain JS over the JSON API in rmq_core/dashboard/app.py (no build step, no CDN).
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const page = () => $("#page");

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmtTime(ms) {
  if (!ms || ms <= 0) return "-";
  const d = new Date(Number(ms));
  const p = n => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}
function fmtNum(v, digits = 0) { return v === null || v === undefined ? "-" : Number(v).toFixed(digits); }
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  for (n = Number(n); n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function showError(msg) { const e = $("#error"); e.textContent = msg; e.hidden = !msg; }
function showNotice(msg) { const e = $("#notice"); e.textContent = msg; e.hidden = !msg; }

async function api(path, body) {
  const opts = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const r = await fetch(path, opts);
  if (r.status === 401) {  // no session (a login console): to the login page
    location.replace("/login.html");
    throw new Error("not logged in");
  }
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || `${r.status} ${r.statusText}`);
  return data;
}

// A table from rows: cols = [[header, key or fn(row), "num"?], ...]
function table(id, cols, rows, opts = {}) {
  const head = cols.map(c => `<th class="${c[2] || ""}">${esc(c[0])}</th>`).join("");
  const body = rows.map((r, i) => {
    const cells = cols.map(c => {
      const v = typeof c[1] === "function" ? c[1](r) : esc(r[c[1]]);
      return `<td class="${c[2] || ""}">${v}</td>`;
    }).join("");
    return `<tr data-i="${i}" class="${opts.clickable ? "clickable" : ""}">${cells}</tr>`;
  }).join("");
  const empty = rows.length ? "" : `<tr><td colspan="${cols.length}" class="muted">${esc(opts.empty || "nothing here")}</td></tr>`;
  return `<table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}${empty}</tbody></table>`;
}
function onRows(id, rows, fn) {
  const t = document.getElementById(id);
  if (!t) return;
  t.querySelectorAll("tbody tr[data-i]").forEach(tr => tr.addEventListener("click", ev => {
    if (ev.target.closest("button, input, a")) return;
    t.querySelectorAll("tr.selected").forEach(x => x.classList.remove("selected"));
    tr.classList.add("selected");
    fn(rows[Number(tr.dataset.i)]);
  }));
}

const kindBadge = k => `<span class="badge ${k === "normal" ? "ok" : k === "dlq" ? "warn" : ""}">${esc(k)}</span>`;

// --- dashboard: the brokers' and the busiest topics' TPS over time (charts drawn by the server) ---
async function pageDashboard() {
  const c = await api("/api/charts");
  page().innerHTML = `
    <h2>Dashboard <span class="muted" id="charts-note">a point every ${esc(c.interval)} s · ${esc(c.points)} so far</span></h2>
    <div class="grid2">
      <div class="card chart" id="chart-broker-in">${c.brokers_in}</div>
      <div class="card chart" id="chart-broker-out">${c.brokers_out}</div>
      <div class="card chart" id="chart-topics">${c.topics}</div>
    </div>`;
}

async function showChart(sel, path) {
  const box = $(sel);
  try { const c = await api(path); if (box.isConnected) box.innerHTML = c.svg; }
  catch (e) { box.innerHTML = `<span class="muted">${esc(e.message)}</span>`; }
}

// --- cluster: brokers and topics at once ------------------------------------------------------
async function pageCluster() {
  const c = await api("/api/cluster");
  $("#namesrv").textContent = c.namesrv ? `name server ${c.namesrv}` : "";
  page().innerHTML = `
    <h2>Brokers</h2><div class="card">${table("brokers", [
      ["Cluster", "cluster"], ["Broker Name", "broker_name"], ["BID", "bid", "num"],
      ["Role", r => `<span class="badge ${r.role === "MASTER" ? "master" : ""}">${esc(r.role)}</span>`],
      ["Address", "addr"], ["Version", "version"],
      ["InTPS", r => fmtNum(r.in_tps, 2), "num"], ["OutTPS", r => fmtNum(r.out_tps, 2), "num"],
      ["Msgs In Total", "msg_put_total", "num"], ["Msgs Out Total", "msg_get_total", "num"],
      ["Replication", "replication"],
      ["Lag", r => r.lag_bytes === null || r.lag_bytes === undefined ? "-" : fmtBytes(r.lag_bytes), "num"],
      ["Epoch", r => r.epoch === null || r.epoch === undefined ? "-" : esc(String(r.epoch)), "num"],
      ["Sync State Set", r => Array.isArray(r.sync_state_set) ? esc(`{${r.sync_state_set.join(", ")}}`) : "-"],
      ["Disk", r => r.disk_ratio === null || r.disk_ratio === undefined ? "-" : (100 * r.disk_ratio).toFixed(1) + "%", "num"],
    ], c.brokers, {empty: "no broker registered"})}</div>
    <h2>Topics <span class="muted">(${c.topics.length})</span></h2><div class="card">${table("cluster-topics", [
      ["Topic", r => `<a href="#/topics/${encodeURIComponent(r.topic)}">${esc(r.topic)}</a>`], ["Kind", r => kindBadge(r.kind)],
    ], c.topics, {empty: "no topics"})}</div>`;
}

// --- topics -------------------------------------------------------------------------------------------
async function pageTopics(selected) {
  const topics = await api("/api/topics");
  page().innerHTML = `
    <h2>Create topic</h2><div class="card">
      <form class="inline" id="create-topic-form">
        <label>Topic <input id="new-topic" required pattern="[A-Za-z0-9%|_-]+" placeholder="TopicA"></label>
        <label>Queues <input id="new-topic-queues" type="number" min="1" value="8" style="width:6em"></label>
        <button type="submit" id="create-topic">Create</button>
      </form></div>
    <div class="grid2">
      <div><h2>Topics <span class="muted">(${topics.length})</span></h2><div class="card">
        <form class="inline" onsubmit="return false"><label>Filter <input id="topic-filter" placeholder="name contains"></label></form>
        <div id="topic-list"></div></div></div>
      <div><h2 id="topic-title">Queues</h2><div class="card" id="topic-detail"><span class="muted">pick a topic</span></div></div>
    </div>`;
  const render = () => {
    const f = $("#topic-filter").value.toLowerCase();
    const rows = topics.filter(t => t.topic.toLowerCase().includes(f));
    $("#topic-list").innerHTML = table("topics", [["Topic", "topic"], ["Kind", r => kindBadge(r.kind)]], rows, {clickable: true});
    onRows("topics", rows, r => { location.hash = `#/topics/${encodeURIComponent(r.topic)}`; });
  };
  $("#topic-filter").addEventListener("input", render);
  render();
  $("#create-topic-form").addEventListener("submit", async ev => {
    ev.preventDefault();
    const topic = $("#new-topic").value.trim();
    try {
      const r = await api("/api/topic", {topic, queues: Number($("#new-topic-queues").value)});
      showNotice(`topic ${r.topic} created on ${r.brokers.join(", ")}`);
      go(`#/topics/${encodeURIComponent(topic)}`);
    } catch (e) { showError(e.message); }
  });
  if (selected) await topicDetail(selected);
}

async function topicDetail(topic) {
  $("#topic-title").textContent = `Queues of ${topic}`;
  const rows = await api(`/api/topic?topic=${encodeURIComponent(topic)}`);
  $("#topic-detail").innerHTML = table("topic-queues", [
    ["Broker Name", "broker_name"], ["QID", "qid", "num"], ["Min Offset", "min_offset", "num"],
    ["Max Offset", "max_offset", "num"], ["Last Updated", r => fmtTime(r.last_updated)],
  ], rows) + `<div class="chart" id="topic-chart"></div><p><button class="danger" id="delete-topic">Delete ${esc(topic)}</button></p>`;
  showChart("#topic-chart", `/api/chart/topic?topic=${encodeURIComponent(topic)}`);
  $("#delete-topic").addEventListener("click", async () => {
    if (!confirm(`Delete topic ${topic} from every broker and the name server?`)) return;
    try {
      await api("/api/topic/delete", {topic});
      showNotice(`topic ${topic} deleted`);
      go("#/topics");
    } catch (e) { showError(e.message); }
  });
}

// --- consumer groups --------------------------------------------------------------------------------
async function pageGroups(selected) {
  const groups = await api("/api/groups");
  page().innerHTML = `
    <h2>Consumer groups <span class="muted">(${groups.length})</span></h2><div class="card">${table("groups", [
      ["Group", "group"], ["State", r => r.online ? `<span class="badge ok">online</span>` : `<span class="badge">offline</span>`],
      ["Members", "members", "num"], ["Model", r => esc(r.message_model || "-")], ["Type", r => esc(r.consume_type || "-")],
      ["Consume TPS", r => fmtNum(r.consume_tps, 2), "num"], ["Diff Total", "diff_total", "num"],
      ["Inflight", "inflight_total", "num"],
    ], groups, {clickable: true, empty: "no consumer groups"})}</div>
    <div id="group-detail"></div>`;
  onRows("groups", groups, g => { location.hash = `#/groups/${encodeURIComponent(g.group)}`; });
  if (selected) await groupDetail(selected);
}

async function groupDetail(group) {
  const g = await api(`/api/group?group=${encodeURIComponent(group)}`);
  const topics = [...new Set(g.progress.map(p => p.topic))];
  const now = fmtTime(Date.now());
  $("#group-detail").innerHTML = `
    <h2 id="group-title">${esc(group)}</h2>
    <div class="grid2">
      <div class="card"><b>Members</b>${table("group-members", [
        ["Client ID", "client_id"], ["Address", "addr"], ["Language", "language"], ["Version", "version"],
      ], g.members, {empty: "no live consumer"})}</div>
      <div class="card"><b>Reset offset by time</b>
        <form class="inline" id="reset-form">
          <label>Topic <select id="reset-topic">${topics.map(t => `<option>${esc(t)}</option>`).join("")}</select></label>
          <label>Time ${timeInput("reset-time", now)}</label>
          <button type="submit" id="reset-offset">Reset</button>
        </form></div>
    </div>
    <div class="card"><b>Progress</b> <span class="muted">Consume TPS ${fmtNum(g.consume_tps, 2)} · Diff Total <span id="diff-total">${esc(g.diff_total)}</span> · Inflight ${esc(g.inflight_total)}</span>
    ${table("group-progress", [
      ["Topic", "topic"], ["Broker Name", "broker_name"], ["QID", "qid", "num"], ["Broker Offset", "broker_offset", "num"],
      ["Consumer Offset", "consumer_offset", "num"], ["Diff", "diff", "num"], ["Inflight", "inflight", "num"],
      ["LastTime", r => fmtTime(r.last_time)],
    ], g.progress, {empty: "no committed offsets"})}
    <div class="chart" id="group-chart"></div></div>`;
  showChart("#group-chart", `/api/chart/group?group=${encodeURIComponent(group)}`);
  $("#reset-form").addEventListener("submit", async ev => {
    ev.preventDefault();
    try {
      const timestamp = epochMs($("#reset-time").value);
      const r = await api("/api/group/reset", {group, topic: $("#reset-topic").value, timestamp});
      showNotice(`${group} reset on ${r.topic}: ${r.queues.length} queues moved to ${fmtTime(r.timestamp)}`);
      await groupDetail(group);
    } catch (e) { showError(e.message); }
  });
}

// --- messages -----------------------------------------------------------------------------------------
const msgCols = [
  ["Message ID", "msg_id"], ["Topic", "topic"], ["Tags", "tags"], ["Keys", "keys"], ["Broker", "broker_name"],
  ["QID", "qid", "num"], ["Offset", "queue_offset", "num"], ["Store Time", r => fmtTime(r.store_time)],
  ["Body", r => `<span class="body">${esc(r.body_preview)}</span>`],
];

// Dates are typed as the tables show them (fmtTime: local "YYYY-MM-DD HH:MM:SS"), one format
// on every page whatever the browser's locale; epochMs reads one back.
function epochMs(value) {
  const m = /^\s*(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2}))?)?\s*$/.exec(value);
  const d = m && new Date(+m[1], +m[2] - 1, +m[3], +(m[4] || 0), +(m[5] || 0), +(m[6] || 0));
  if (!d || d.getMonth() !== +m[2] - 1 || d.getDate() !== +m[3])
    throw new Error(`bad date and time ${JSON.stringify(value)}: expected YYYY-MM-DD HH:MM:SS`);
  return d.getTime();
}
const timeInput = (id, value, title = "") =>
  `<input id="${id}" class="when" value="${esc(value)}" placeholder="YYYY-MM-DD HH:MM:SS" size="19" title="${esc(title)}">`;

async function pageMessages() {
  const hourAgo = fmtTime(Date.now() - 3600 * 1000);
  page().innerHTML = `
    <h2>Search messages</h2><div class="card">
      <form class="inline" id="search-form">
        <label>By <select id="search-by"><option value="id">Message ID</option><option value="key">Key</option><option value="time">Topic + time</option></select></label>
        <label>Message ID <input id="search-id" size="34"></label>
        <label>Topic <input id="search-topic"></label>
        <label>Key <input id="search-key"></label>
        <label>From ${timeInput("search-begin", hourAgo)}</label>
        <label>To ${timeInput("search-end", "", "empty: now")}</label>
        <button type="submit" id="search">Search</button>
      </form></div>
    <div class="card" id="search-results"><span class="muted">no search yet</span></div>
    <div id="message-detail"></div>`;
  $("#search-form").addEventListener("submit", async ev => {
    ev.preventDefault();
    const by = $("#search-by").value;
    const q = new URLSearchParams();
    if (by === "id") { q.set("id", $("#search-id").value.trim()); if ($("#search-topic").value.trim()) q.set("topic", $("#search-topic").value.trim()); }
    else if (by === "key") { q.set("topic", $("#search-topic").value.trim()); q.set("key", $("#search-key").value.trim()); }
    try {
      if (by === "time") {
        q.set("topic", $("#search-topic").value.trim());
        q.set("begin", $("#search-begin").value.trim() ? epochMs($("#search-begin").value) : 0);
        if ($("#search-end").value.trim()) q.set("end", epochMs($("#search-end").value));
      }
      showError("");
      const rows = await api(`/api/messages?${q}`);
      $("#search-results").innerHTML = `<b>${rows.length} message(s)</b>` + table("messages", msgCols, rows, {clickable: true, empty: "no message found"});
      onRows("messages", rows, messageDetail);
      if (rows.length === 1) messageDetail(rows[0]);
    } catch (e) { showError(e.message); }
  });
}

function messageDetail(m) {
  const props = Object.entries(m.properties || {}).map(([k, v]) => ({k, v}));
  $("#message-detail").innerHTML = `
    <h2>Message ${esc(m.msg_id)}</h2>
    <div class="grid2">
      <div class="card"><table id="message-fields">
        <tr><th>Topic</th><td>${esc(m.topic)}</td></tr><tr><th>Tags</th><td>${esc(m.tags)}</td></tr>
        <tr><th>Keys</th><td>${esc(m.keys)}</td></tr><tr><th>Queue</th><td>${esc(m.broker_name)} / ${esc(m.qid)} @ ${esc(m.queue_offset)}</td></tr>
        <tr><th>Offset Msg ID</th><td>${esc(m.offset_msg_id)}</td></tr><tr><th>Born Host</th><td>${esc(m.born_host)}</td></tr>
        <tr><th>Store Time</th><td>${fmtTime(m.store_time)}</td></tr><tr><th>Reconsume Times</th><td>${esc(m.reconsume_times)}</td></tr>
        <tr><th>Body (${esc(m.body_size)} bytes)</th><td class="body" id="message-body">${esc(m.body_preview)}</td></tr>
      </table>
      <p><button id="resend-message">Resend to ${esc(m.topic)}</button></p></div>
      <div class="card"><b>Delivery per consumer group</b>${table("delivery", [
        ["Group", "group"], ["State", r => `<span class="badge ${r.state === "CONSUMED" ? "ok" : "warn"}">${esc(r.state)}</span>`],
        ["Consumer Offset", "consumer_offset", "num"],
      ], m.delivery || [], {empty: "no group consumes this topic"})}
      <b>Properties</b>${table("message-props", [["Key", "k"], ["Value", "v"]], props)}</div>
    </div>
    <h2>Trace</h2><div class="card" id="message-trace"><span class="muted">loading the trace…</span></div>`;
  showTrace(m.msg_id);
  $("#resend-message").addEventListener("click", async () => {
    try {
      const r = await api("/api/message/resend", {topic: m.topic, id: m.msg_id});
      showNotice(`resent as ${r.msg_id} (${r.status})`);
    } catch (e) { showError(e.message); }
  });
}

// A message's trace (records of traced producers and consumers) as a timeline: one row per record,
// its time after the first record and its cost drawn to one scale.
async function showTrace(msgId) {
  const box = $("#message-trace");
  let views;
  try { views = await api(`/api/message/trace?id=${encodeURIComponent(msgId)}`); }
  catch (e) { box.innerHTML = `<span class="muted">${esc(e.message)}</span>`; return; }
  if (!views.length) {
    box.innerHTML = `<span class="muted">no trace recorded (send and consume with enable_msg_trace=True)</span>`;
    return;
  }
  // (the records carry RocketMQ's TraceView names: msgType, timeStamp, costTime, groupName, ...)
  const t0 = Math.min(...views.map(v => v.timeStamp));
  const span = Math.max(1, ...views.map(v => v.timeStamp - t0 + v.costTime));
  const pct = ms => (100 * ms / span).toFixed(2);
  const label = {Pub: "sent", SubBefore: "consume start", SubAfter: "consumed"};
  box.innerHTML = `<ol class="timeline" id="trace-timeline">${views.map(v => `
    <li class="trace-${esc(v.msgType)}" data-type="${esc(v.msgType)}" data-msg-id="${esc(v.msgId)}">
      <span class="when">${fmtTime(v.timeStamp)} <span class="muted">+${v.timeStamp - t0} ms</span></span>
      <span class="badge ${v.status === "success" ? "ok" : "warn"}">${esc(label[v.msgType] || v.msgType)}</span>
      <b class="group">${esc(v.groupName)}</b>
      <span class="muted">${esc(v.msgType === "Pub" ? `to ${v.storeHost}` : `on ${v.clientHost}`)} · ${esc(v.costTime)} ms · ${esc(v.status)}</span>
      <span class="bar"><span style="margin-left:${pct(v.timeStamp - t0)}%;width:max(2px,${pct(v.costTime)}%)"></span></span>
    </li>`).join("")}</ol>`;
}

// --- DLQ ------------------------------------------------------------------------------------------------
async function pageDlq(selected) {
  const groups = await api("/api/dlq/groups");
  page().innerHTML = `
    <h2>Dead-letter queues <span class="muted">(${groups.length})</span></h2><div class="card">${table("dlq-groups", [
      ["Consumer Group", "group"], ["Dead Letters", r => fmtNum(r.dead_letters), "num"],
    ], groups, {clickable: true, empty: "no group has a dead-letter queue"})}</div>
    <div class="card" id="dlq-results"><span class="muted">pick a group</span></div>`;
  onRows("dlq-groups", groups, g => go(`#/dlq/${encodeURIComponent(g.group)}`));
  if (selected) await dlqList(selected);
}

async function dlqList(group) {
  const rows = await api(`/api/dlq?group=${encodeURIComponent(group)}`);
  $("#dlq-results").innerHTML = `<b>${rows.length} dead letter(s) of ${esc(group)}</b>` + table("dlq-messages", [
    ["", r => `<input type="checkbox" class="dlq-pick" value="${esc(r.msg_id)}">`],
    ["Message ID", "msg_id"], ["Origin Topic", "origin_topic"], ["Tags", "tags"], ["Keys", "keys"],
    ["Reconsume Times", "reconsume_times", "num"], ["Store Time", r => fmtTime(r.store_time)],
    ["Body", r => `<span class="body">${esc(r.body_preview)}</span>`],
  ], rows, {empty: "no dead letters"}) + `<p><button id="dlq-resend-selected">Resend selected</button>
    <button class="secondary" id="dlq-resend-all">Resend all</button></p>`;
  const resend = async ids => {
    try {
      const r = await api("/api/dlq/resend", {group, ids});
      showNotice(`${r.resent} dead letter(s) of ${group} resent`);
    } catch (e) { showError(e.message); }
  };
  $("#dlq-resend-selected").addEventListener("click", () => {
    const ids = [...document.querySelectorAll(".dlq-pick:checked")].map(x => x.value);
    if (!ids.length) { showError("select dead letters first"); return; }
    resend(ids);
  });
  $("#dlq-resend-all").addEventListener("click", () => resend(null));
}

// --- routing --------------------------------------------------------------------------------------------
const pages = {dashboard: pageDashboard, cluster: pageCluster, topics: pageTopics, groups: pageGroups,
               messages: pageMessages, dlq: pageDlq};

let currentPage = null;

async function route() {
  const [name, arg] = (location.hash.replace(/^#\/?/, "") || "dashboard").split("/");
  if (currentPage !== null && name !== currentPage) showNotice("");  // a notice belongs to its page
  currentPage = name;
  const fn = pages[name] || pageDashboard;
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.page === (pages[name] ? name : "dashboard")));
  showError("");
  document.body.dataset.loading = "1";
  try {
    await fn(arg ? decodeURIComponent(arg) : undefined);
  } catch (e) {
    showError(e.message);
  } finally {
    document.body.dataset.loading = "";
    document.body.dataset.page = name || "dashboard";
  }
}

function go(hash) {  // to a page, re-rendered even when it is the current one
  if (location.hash === hash) route(); else location.hash = hash;
}

window.addEventListener("hashchange", route);
route();
// the cluster page and the dashboard follow the brokers' rates (every 10 s, while shown)
setInterval(() => {
  if (document.body.dataset.loading) return;
  const fn = {cluster: pageCluster, dashboard: pageDashboard}[currentPage];
  if (fn) fn().catch(e => showError(e.message));
}, 10000);

// With a login (rmq dashboard --users): who is logged in, and a way out.
(async () => {
  const s = await api("/api/session");
  if (!s.login) return;
  $("#session-user").textContent = s.user;
  $("#session").hidden = false;
  $("#logout").addEventListener("click", async () => {
    await api("/api/logout", {});
    location.replace("/login.html");
  });
})().catch(e => showError(e.message));
