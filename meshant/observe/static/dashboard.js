// meshant dashboard: renders the queen's snapshots as they arrive over server-sent
// events (/api/events). No library, nothing fetched from elsewhere: works offline.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  let last = null;
  let openTask = null;

  function text(el, v) { if (el.textContent !== String(v)) el.textContent = String(v); }
  function fmtSecs(s) {
    if (s === null || s === undefined) return "–";
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
  function button(td, label, op, target) {
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
      cell(tr, f.in_flight); cell(tr, f.tools.join(" "));
      cell(tr, Object.entries(f.labels || {}).map(([k, v]) => k + "=" + v).join(" "));
      cell(tr, fmtSecs(f.last_seen_age) + " ago"); cell(tr, f.breaker, "s-" + f.breaker);
      const td = cell(tr, "");
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
      cell(tr, t.capability); cell(tr, t.forager); cell(tr, t.attempt); cell(tr, fmtSecs(t.age));
      button(cell(tr, ""), "cancel", "cancel", t.task);
    });
    rows("recent", s.recent_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability); cell(tr, t.state, "s-" + t.state); cell(tr, t.attempt);
      const h = t.history; cell(tr, h.length ? fmtSecs(h[h.length - 1][0]) : "");
    });
    text($("waiting-count"), "(" + s.waiting_input + ")");
    rows("waiting", s.waiting_input_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability); cell(tr, t.forager);
      const h = t.history; cell(tr, h.length ? fmtSecs(t.age - h[h.length - 1][0]) : "");
    });
    text($("graphs-count"), "(" + s.graphs_running + ")");
    rows("graphs", s.graphs, (tr, g) => {
      cell(tr, g.graph); cell(tr, g.state, "s-" + g.state); cell(tr, g.nodes);
      cell(tr, g.client);
    });
    rows("dlq", s.dead_letter_tasks, (tr, t) => {
      taskRow(tr, t);
      cell(tr, t.capability);
      cell(tr, t.error ? t.error.code + ": " + t.error.message : "");
      button(cell(tr, ""), "retry", "dlq-retry", t.task);
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

  // -- charts: one SVG polyline per series, scaled to the window's maximum ------------------
  function line(svg, series, color, max, t0, t1) {
    const pts = series.filter((p) => p[1] !== null).map((p) =>
      ((p[0] - t0) / Math.max(1e-9, t1 - t0) * 300).toFixed(1) + "," +
      (100 - (p[1] / max) * 96 - 2).toFixed(1));
    const pl = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    pl.setAttribute("points", pts.join(" ")); pl.setAttribute("stroke", color);
    svg.appendChild(pl);
  }
  function chart(id, series, colors, legend, fmt) {
    const svg = $(id); svg.replaceChildren();
    const all = series.flatMap((s) => s.map((p) => p[1])).filter((v) => v !== null);
    if (!series[0].length) return;
    const max = Math.max(1e-9, ...all) * 1.1;
    const t0 = series[0][0][0], t1 = series[0][series[0].length - 1][0];
    series.forEach((s, i) => line(svg, s, colors[i], max, t0, t1));
    const lastv = series.map((s) => s.length ? s[s.length - 1][1] : null);
    text($(legend), legend_text(lastv, fmt, max / 1.1));
  }
  function legend_text(vals, fmt, max) {
    return vals.map((v) => (v === null ? "–" : fmt(v))).join(" / ") + "   (max " + fmt(max) + ")";
  }
  function charts(h) {
    if (!h || h.length < 2) return;
    const rate = [];
    for (let i = 1; i < h.length; i++) {
      const j = Math.max(0, i - 4); // smoothed over ~2 s of snapshots
      const dt = h[i][0] - h[j][0];
      rate.push([h[i][0], dt > 0 ? (h[i][1] + h[i][2] - h[j][1] - h[j][2]) / dt : 0]);
    }
    chart("chart-throughput", [rate], ["#3ecf8e"], "legend-throughput", (v) => v.toFixed(1) + "/s");
    chart("chart-latency", [h.map((p) => [p[0], p[3]]), h.map((p) => [p[0], p[4]])],
      ["#3ecf8e", "#ef5b5b"], "legend-latency", fmtSecs);
    chart("chart-queue", [h.map((p) => [p[0], p[5]]), h.map((p) => [p[0], p[6]])],
      ["#f0b429", "#5aa9e6"], "legend-queue", (v) => String(Math.round(v)));
  }

  // -- one task's timeline ----------------------------------------------------------------
  async function showTask(id) { openTask = id; await refreshDetail(id, true); }
  async function refreshDetail(id, scroll) {
    const panel = $("task-detail");
    let t = null;
    if (last) for (const k of ["running_tasks", "recent_tasks", "dead_letter_tasks"])
      for (const x of last[k]) if (x.task === id) t = x;
    if (!t) {
      if (!scroll) return; // refreshes only follow listed tasks; a click asks the queen
      const r = await fetch("/api/task/" + encodeURIComponent(id));
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
    const headers = { "Content-Type": "application/json" };
    const token = $("token").value.trim();
    if (token) headers["Authorization"] = "Bearer " + token;
    try {
      const r = await fetch("/api/action/" + op, { method: "POST", headers, body: JSON.stringify({ target }) });
      const body = await r.json();
      out.className = r.ok ? "ok" : "err";
      out.textContent = r.ok ? op + " " + target + ": done" : op + " " + target + " refused (" + r.status + "): " + body.error;
    } catch (e) { out.className = "err"; out.textContent = op + " failed: " + e; }
  }

  // -- the live feed -----------------------------------------------------------------------
  function connect() {
    const es = new EventSource("/api/events");
    es.onopen = () => { $("live").className = "badge on"; text($("live"), "live"); };
    es.onmessage = (ev) => { try { render(JSON.parse(ev.data)); } catch (e) { console.error(e); } };
    es.onerror = () => { $("live").className = "badge off"; text($("live"), "reconnecting"); };
  }
  connect();
})();
