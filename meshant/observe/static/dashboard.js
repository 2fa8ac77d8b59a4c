// meshant dashboard: renders the queen's snapshots as they arrive over its live feed
// (/api/events, server-sent events read with fetch so a token can go with it). No
// library, nothing fetched from elsewhere: works offline.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "meshant-token"; // kept for this tab only (sessionStorage)
  let token = sessionStorage.getItem(KEY) || "";
  let access = { read: false, act: false, actions: false, read_token: false };
  let last = null;
  let openTask = null;
  let feed = null; // the live feed's AbortController

  function text(el, v) { if (el.textContent !== String(v)) el.textContent = String(v); }
  function fmtSecs(s) {
    if (s === null || s === undefined || Number.isNaN(s)) return "–";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function sum(obj) { return Object.values(obj || {}).reduce((a, b) => a + b, 0); }
  function cell(tr, v, cls) {
    const td = document.createElement("td");
    td.textContent = v === null || v === undefined ? "" : String(v);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }
  // Action buttons exist only while this queen takes actions (--http-token): a
  // read-only dashboard shows none.
  function button(td, label, op, target) {
    if (!access.actions) return;
    const b = document.createElement("button");
    b.type = "button"; b.textContent = label;
    b.dataset.op = op; b.dataset.target = target;
    b.addEventListener("click", (ev) => { ev.stopPropagation(); act(op, target); });
    td.appendChild(b);
  }
  function rows(tableId, items, fill) {
    const tbody = $(tableId).querySelector("tbody");
    const frag = document.createDocumentFragment();
    for (const it of items) { const tr = document.createElement("tr"); fill(tr, it); frag.appendChild(tr); }
    tbody.replaceChildren(frag);
  }
  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (token) h["Authorization"] = "Bearer " + token;
    return h;
  }

  function render(s) {
    last = s;
    text($("queen-name"), s.queen.name);
    text($("role"), s.role + (s.term ? " · term " + s.term : "") +
      (s.leader ? " · leader at " + s.leader : ""));
    text($("colony"), "colony " + s.queen.colony);
    text($("uptime"), "up " + fmtSecs(s.queen.uptime));
    text($("stat-submitted"), sum(s.submitted));
    text($("stat-completed"), s.counters.completed);
    text($("stat-failed"), s.counters.failed);
    text($("stat-running"), s.running);
    text($("stat-queued"), s.queued);
    text($("stat-foragers"), s.foragers.length);
    text($("stat-slots"), s.slots_free);
    text($("stat-dlq"), s.dead_letters);
    rows("foragers", s.foragers, (tr, f) => {
      tr.dataset.name = f.name;
      cell(tr, f.name); cell(tr, f.state, "s-" + f.state); cell(tr, f.slots);
      cell(tr, f.in_flight);
      // Each capability's own description (its hello's describe), on hover.
      cell(tr, f.tools.join(" ")).title = Object.entries(f.describe || {})
        .map(([k, v]) => k + ": " + (v.description || "")).join("\n");
      cell(tr, Object.entries(f.labels || {}).map(([k, v]) => k + "=" + v).join(" "));
      cell(tr, fmtSecs(f.last_seen_age) + " ago"); cell(tr, f.breaker, "s-" + f.breaker);
      const td = cell(tr, "", "act");
      button(td, "drain", "drain", f.name); button(td, "halt", "halt", f.name);
    });
    text($("gone"), s.recently_gone.length
      ? "recently offline: " + s.recently_gone.map((g) => g.name).join(", ") : "");
    const caps = new Set([...Object.keys(s.queues), ...Object.keys(s.submitted)]);
    rows("queues", [...caps].sort(), (tr, c) => {
      cell(tr, c); cell(tr, s.queues[c] || 0); cell(tr, s.submitted[c] || 0);
      cell(tr, s.completed[c] || 0); cell(tr, s.failed[c] || 0);
      const b = s.breakers.capabilities[c] || "closed"; cell(tr, b, "s-" + b);
    });
    rows("running", s.running_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability); cell(tr, t.forager); cell(tr, t.attempt);
      cell(tr, t.started === null ? "–" : fmtSecs(t.age - t.started)); cell(tr, fmtSecs(t.age));
      button(cell(tr, "", "act"), "cancel", "cancel", t.task);
    });
    rows("recent", s.recent_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability); cell(tr, t.state, "s-" + t.state); cell(tr, t.attempt);
      const h = t.history; const end = h.length ? h[h.length - 1][0] : null;
      cell(tr, end === null ? "" : fmtSecs(end));
      cell(tr, end === null || t.started === null ? "–" : fmtSecs(end - t.started));
    });
    text($("waiting-count"), "(" + s.waiting_input + ")");
    rows("waiting", s.waiting_input_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability); cell(tr, t.forager);
      const h = t.history; cell(tr, h.length ? fmtSecs(t.age - h[h.length - 1][0]) : "");
    });
    text($("suspended-count"), "(" + (s.suspended || 0) + ")");
    rows("suspended", s.suspended_tasks || [], (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability);
      const w = t.waiting || {};
      cell(tr, w.request ? "an answer to " + w.request
               : w.child ? "sub-task " + w.child
               : w.until ? "until " + new Date(w.until * 1000).toLocaleTimeString() : "");
      cell(tr, t.steps || 0);
      button(cell(tr, "", "act"), "cancel", "cancel", t.task);
    });
    text($("graphs-count"), "(" + s.graphs_running + ")");
    rows("graphs", s.graphs, (tr, g) => {
      cell(tr, g.graph); cell(tr, g.state, "s-" + g.state); cell(tr, g.nodes);
      cell(tr, g.client);
    });
    text($("schedules-count"), "(" + (s.schedules || 0) + ")");
    rows("schedules", s.next_schedules || [], (tr, x) => {
      cell(tr, x.name); cell(tr, x.cron + (x.tz !== "UTC" ? " " + x.tz : ""));
      cell(tr, x.capability);
      cell(tr, x.paused ? "paused" : x.next ? new Date(x.next * 1000).toLocaleString() : "–",
           x.paused ? "s-cancelled" : "");
      cell(tr, x.fired + (x.skipped ? " / " + x.skipped + " skipped" : ""));
    });
    rows("dlq", s.dead_letter_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability);
      cell(tr, t.error ? t.error.code + ": " + t.error.message : "");
      button(cell(tr, "", "act"), "retry", "dlq-retry", t.task);
    });
    text($("memory-count"), "(" + s.memory.keys + " keys)");
    const ul = $("memory"); const frag = document.createDocumentFragment();
    for (const k of s.memory.names) { const li = document.createElement("li"); li.textContent = k; frag.appendChild(li); }
    ul.replaceChildren(frag);
    charts(s.history);
    if (openTask) refreshDetail(openTask, false);
  }

  function taskRow(tr, t) {
    tr.className = "clickable"; tr.dataset.task = t.task;
    tr.addEventListener("click", () => showTask(t.task));
    cell(tr, t.task);
  }

  // -- charts: SVG drawn at the element's own pixel size, with axes and a legend ----------
  const NS = "http://www.w3.org/2000/svg";
  function svgEl(name, attrs, content) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (content !== undefined) e.textContent = content;
    return e;
  }
  function niceMax(v) { // the smallest 1, 2, 2.5 or 5 × 10^k at or above v
    if (!(v > 0)) return 1;
    const e = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * e >= v * 0.9999) return m * e;
    return 10 * e;
  }
  function ago(s) {
    if (s < 0.05) return "now";
    if (s < 10) return "−" + s.toFixed(1) + " s";
    return s < 90 ? "−" + Math.round(s) + " s" : "−" + (s / 60).toFixed(s < 600 ? 1 : 0) + " min";
  }
  // series: [{name, color, points: [[t, v], ...]}]; fmt labels the y axis (with its unit)
  function chart(id, legendId, series, fmt) {
    const svg = $(id);
    const W = Math.max(120, Math.round(svg.clientWidth || 300));
    const H = Math.max(80, Math.round(svg.clientHeight || 120));
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.replaceChildren();
    const L = 56, R = 10, T = 8, B = 18; // room for the axes' labels
    const pts = series.flatMap((s) => s.points);
    if (pts.length < 2) return;
    const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
    const vals = pts.map((p) => p[1]).filter((v) => v !== null);
    const max = niceMax(Math.max(0, ...vals));
    const x = (t) => L + (t - t0) / Math.max(1e-9, t1 - t0) * (W - L - R);
    const y = (v) => T + (1 - v / max) * (H - T - B);
    for (const f of [0, 0.5, 1]) { // the y axis: 0, half, top, with units
      const v = max * f;
      svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "gridline" }));
      svg.appendChild(svgEl("text", { x: L - 5, y: y(v) + 3.5, "text-anchor": "end", class: "tick" }, v === 0 ? "0" : fmt(v)));
    }
    for (const f of [0, 1 / 3, 2 / 3, 1]) { // the x axis: how long ago
      const t = t0 + (t1 - t0) * f;
      svg.appendChild(svgEl("text", { x: x(t), y: H - 4, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle", class: "tick" }, ago(t1 - t)));
    }
    svg.appendChild(svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    for (const s of series) {
      const p = s.points.filter((q) => q[1] !== null).map((q) => x(q[0]).toFixed(1) + "," + y(q[1]).toFixed(1));
      svg.appendChild(svgEl("polyline", { points: p.join(" "), stroke: s.color, class: "series" }));
    }
    const legend = $(legendId); const frag = document.createDocumentFragment();
    for (const s of series) {
      const item = document.createElement("span"); item.className = "item";
      const sw = document.createElement("i"); sw.className = "swatch"; sw.style.background = s.color;
      const lastv = s.points.length ? s.points[s.points.length - 1][1] : null;
      item.append(sw, s.name + " " + (lastv === null ? "–" : fmt(lastv)));
      frag.appendChild(item);
    }
    legend.replaceChildren(frag);
  }
  function charts(h) {
    if (!h || h.length < 2) return;
    const rate = [];
    for (let i = 1; i < h.length; i++) {
      const j = Math.max(0, i - 4); // smoothed over ~2 s of snapshots
      const dt = h[i][0] - h[j][0];
      rate.push([h[i][0], dt > 0 ? (h[i][1] + h[i][2] - h[j][1] - h[j][2]) / dt : 0]);
    }
    const perSec = (v) => (v < 10 ? v.toFixed(1) : Math.round(v)) + "/s";
    chart("chart-throughput", "legend-throughput",
      [{ name: "finished", color: "#3ecf8e", points: rate }], perSec);
    chart("chart-latency", "legend-latency",
      [{ name: "p50", color: "#3ecf8e", points: h.map((p) => [p[0], p[3]]) },
       { name: "p99", color: "#ef5b5b", points: h.map((p) => [p[0], p[4]]) }], fmtSecs);
    const tasks = (v) => (Math.round(v * 10) / 10) + " tasks";
    chart("chart-queue", "legend-queue",
      [{ name: "queued", color: "#f0b429", points: h.map((p) => [p[0], p[5]]) },
       { name: "running", color: "#5aa9e6", points: h.map((p) => [p[0], p[6]]) }], tasks);
  }
  window.addEventListener("resize", () => { if (last) charts(last.history); });

  // -- one task's timeline ----------------------------------------------------------------
  async function showTask(id) { openTask = id; await refreshDetail(id, true); }
  async function refreshDetail(id, scroll) {
    const panel = $("task-detail");
    let t = null;
    if (last) for (const k of ["running_tasks", "recent_tasks", "dead_letter_tasks"])
      for (const x of last[k]) if (x.task === id) t = x;
    if (!t) {
      if (!scroll) return; // refreshes only follow listed tasks; a click asks the queen
      const r = await fetch("/api/task/" + encodeURIComponent(id), { headers: headers() });
      t = await r.json();
      if (!r.ok) { text($("detail-summary"), t.error || "unknown task"); panel.hidden = false; return; }
    }
    text($("detail-id"), t.task);
    text($("detail-summary"), t.capability + " · " + t.state + " · attempt " + t.attempt +
      (t.forager ? " · on " + t.forager : "") + (t.error ? " · " + t.error.code + ": " + t.error.message : ""));
    const ol = $("timeline"); const frag = document.createDocumentFragment();
    for (const [dt, state, why] of t.history) {
      const li = document.createElement("li");
      li.textContent = "+" + fmtSecs(dt) + "  " + state + (why ? " — " + why : "");
      li.className = "s-" + state; frag.appendChild(li);
    }
    ol.replaceChildren(frag);
    panel.hidden = false;
    if (scroll) panel.scrollIntoView({ block: "nearest" });
  }
  $("detail-close").addEventListener("click", () => { openTask = null; $("task-detail").hidden = true; });

  // -- actions: refused by the queen without its token ------------------------------------
  async function act(op, target) {
    const out = $("action-result");
    try {
      const r = await fetch("/api/action/" + op, {
        method: "POST", headers: headers({ "Content-Type": "application/json" }),
        body: JSON.stringify({ target }),
      });
      const body = await r.json();
      out.className = r.ok ? "ok" : "err";
      out.textContent = r.ok ? op + " " + target + ": done" : op + " " + target + " refused (" + r.status + "): " + body.error;
    } catch (e) { out.className = "err"; out.textContent = op + " failed: " + e; }
  }
  function showAccess() {
    $("token-label").hidden = !access.actions;
    text($("actions-state"), !access.actions
      ? "Read-only: this queen was started without --http-token, so drain, halt, cancel and retry are off."
      : access.act ? "Actions on: your token allows drain, halt, cancel and retry."
        : "Drain, halt, cancel and retry need the queen's --http-token: enter it here.");
    if (last) render(last);
  }
  $("token").addEventListener("input", async () => {
    setToken($("token").value.trim());
    await checkAccess();
    showAccess();
  });
  function setToken(t) {
    token = t;
    if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY);
  }
  async function checkAccess() {
    const r = await fetch("/api/access", { headers: headers() });
    access = await r.json();
    return access;
  }

  // -- the live feed: server-sent events over fetch (EventSource cannot send a token) -------
  function live(on, label) { $("live").className = "badge " + (on ? "on" : "off"); text($("live"), label); }
  async function connect() {
    if (feed) feed.abort();
    const ctl = feed = new AbortController();
    try {
      const r = await fetch("/api/events", { headers: headers(), signal: ctl.signal });
      if (r.status === 401) { login("the token was refused"); return; }
      if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
      live(true, "live");
      const reader = r.body.getReader(); const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2);
          const data = ev.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (data) { try { render(JSON.parse(data)); } catch (e) { console.error(e); } }
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    if (feed !== ctl) return;
    live(false, "reconnecting");
    setTimeout(connect, 1000);
  }

  // -- the read token, asked once per tab when the queen needs one --------------------------
  function login(why) {
    if (feed) feed.abort();
    live(false, "token needed");
    $("login").hidden = false;
    text($("login-result"), why || "");
    $("login-token").focus();
  }
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setToken($("login-token").value.trim());
    await start();
  });
  async function start() {
    try { await checkAccess(); } catch (e) { live(false, "reconnecting"); setTimeout(start, 1000); return; }
    if (!access.read) { login(token ? "the token was refused" : ""); return; }
    $("login").hidden = true;
    if (token && access.actions) $("token").value = token;
    showAccess();
    connect();
  }
  start();
})();
