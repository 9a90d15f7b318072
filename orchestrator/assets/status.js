// The status page's script (orchestrator/src/page.rs serves it; no build step, no library).
// Every second it fetches status.json and redraws: the orchestrator cluster, the machines, and
// per service its view, its plots (SVG, drawn here) and its view history. Text from the server
// only ever goes into text nodes and attributes, never into markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 1000;

// The plots: a title, the unit's formatter, and the series' columns drawn as lines.
const PLOTS = [
  { key: "pause", title: "Epoch pause", fmt: us,
    lines: [["pause_p50_us", "p50", "#2457c5"], ["pause_p99_us", "p99", "#d9822b"]] },
  { key: "checkpoint", title: "Checkpoint size (mean)", fmt: bytes,
    lines: [["checkpoint_bytes", "bytes", "#2457c5"]] },
  { key: "lag", title: "Backup lag", fmt: count,
    lines: [["backup_lag", "epochs not decided", "#2457c5"],
            ["backup_queue", "queued at a backup", "#7a42b8"]] },
  { key: "held", title: "Held output", fmt: bytes,
    lines: [["held_bytes", "bytes", "#2457c5"]] },
];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function us(v) {
  return v >= 1000 ? (v / 1000).toFixed(v >= 10000 ? 0 : 1) + " ms" : Math.round(v) + " µs";
}
function bytes(v) {
  const short = (x) => x.toFixed(1).replace(/\.0$/, "");
  if (v >= 1 << 20) return short(v / (1 << 20)) + " MiB";
  if (v >= 1 << 10) return short(v / (1 << 10)) + " KiB";
  return Math.round(v) + " B";
}
function count(v) {
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}
function ms(v) {
  return v === null || v === undefined ? "–" : Math.round(v) + " ms";
}
function clock(t) {
  const d = new Date(t);
  const p = (n) => String(n).padStart(2, "0");
  return p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
}

// Y axis top: 1, 2 or 5 times a power of ten, at least `max`.
function niceTop(max) {
  if (!(max > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(max)));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

// Y axis top for byte counts: a nice number of B, KiB or MiB.
function niceBytes(max) {
  for (const u of [1 << 20, 1 << 10]) if (max >= u / 2) return niceTop(max / u) * u;
  return niceTop(max);
}

// The time a service's plots span: the window, or less while the series is younger (at least
// 20 s), up to the server's `now_ms`.
function span(series, page) {
  const t1 = page.now_ms, ts = series.t_ms || [];
  const first = ts.length ? ts[0] : t1;
  return { t0: t1 - Math.min(page.window_s * 1000, Math.max(20000, t1 - first)), t1 };
}

function ago(ms) {
  return ms >= 60000 ? `−${Math.round(ms / 60000)} min` : `−${Math.round(ms / 1000)} s`;
}

// One plot as an SVG: time on x (`range`), the lines' values on y, the service's view changes
// as dashed verticals. `data-points` counts the values drawn, for tests and for people reading
// the DOM.
function plot(spec, series, changes, page, range) {
  const W = 460, H = 170, L = 64, R = 10, T = 10, B = 22;
  const { t0, t1 } = range;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const ts = series.t_ms || [];
  let max = 0, points = 0;
  for (const [col] of spec.lines) {
    for (const v of series[col] || []) {
      if (v !== null) { max = Math.max(max, v); points++; }
    }
  }
  const top = spec.fmt === bytes ? niceBytes(max) : niceTop(max);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "data-plot": spec.key,
                         "data-points": points, "aria-label": spec.title });
  for (const f of [0, 0.5, 1]) {
    s.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: y(top * f), y2: y(top * f) }));
    s.append(svg("text", { x: L - 6, y: y(top * f) + 4, "text-anchor": "end" }, spec.fmt(top * f)));
  }
  const step = [5000, 10000, 15000, 30000, 60000].find((st) => (t1 - t0) / st <= 6) || 60000;
  for (let a = Math.floor((t1 - t0) / step) * step; a >= 0; a -= step) {
    s.append(svg("text", { x: x(t1 - a), y: H - 6, "text-anchor": a === 0 ? "end" : "middle" },
                 a === 0 ? "now" : ago(a)));
  }
  // View changes close together get their labels one under the other, three deep; a fourth
  // in a crowd goes unlabelled (the history table has them all).
  let lastX = -Infinity, row = 0;
  for (const c of changes) {
    if (c.proposed_ms < t0 || c.proposed_ms > t1) continue;
    const cx = x(c.proposed_ms);
    row = cx - lastX < 24 ? row + 1 : 0;
    lastX = cx;
    s.append(svg("line", { class: "change", x1: cx, x2: cx, y1: T, y2: H - B }));
    if (row > 2) {
      row = -1;
      continue;
    }
    s.append(svg("text", { class: "change-label", x: cx + 3, y: T + 10 + 12 * row }, "v" + c.view));
  }
  const gap = 3 * page.interval_ms;
  for (const [col, , color] of spec.lines) {
    const vs = series[col] || [];
    let d = "", prev = null;
    for (let i = 0; i < ts.length; i++) {
      if (vs[i] === null || vs[i] === undefined || ts[i] < t0) { prev = null; continue; }
      const move = prev === null || ts[i] - prev > gap;
      d += (move ? "M" : "L") + x(ts[i]).toFixed(1) + " " + y(vs[i]).toFixed(1);
      prev = ts[i];
    }
    if (d) s.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.5,
                                  "data-series": col }));
  }
  if (points === 0) {
    s.append(svg("text", { class: "empty", x: (L + W - R) / 2, y: H / 2, "text-anchor": "middle" },
                 "no figures reported yet"));
  }
  const legend = el("span", { class: "legend" });
  for (const [col, label, color] of spec.lines) {
    const vs = (series[col] || []).filter((v) => v !== null);
    const last = vs.length ? spec.fmt(vs[vs.length - 1]) : "–";
    legend.append(el("i", { style: `background:${color}` }), `${label} ${last}`);
  }
  return el("div", { class: "plot" },
            el("div", { class: "plot-title" }, el("span", {}, spec.title), legend), s);
}

// The newest changes first; older ones beyond `HISTORY_ROWS` are only counted.
const HISTORY_ROWS = 20;

function history(changes) {
  const t = el("table", { class: "history" },
    el("tr", {}, ...["view", "proposed", "change", "primary", "backups", "active after",
                     "detected after", "outage ≈", "takeover"].map((h) => el("th", {}, h))));
  for (const c of changes.slice(-HISTORY_ROWS).reverse()) {
    t.append(el("tr", { "data-view": c.view },
      el("td", {}, c.view),
      el("td", {}, clock(c.proposed_ms)),
      el("td", { class: c.failed ? "failed" : null, "data-failed": c.failed }, c.reason),
      el("td", {}, c.primary),
      el("td", {}, c.backups.join(", ") || "–"),
      c.activated_ms === null ? el("td", { class: "proposed" }, "not yet")
                              : el("td", {}, ms(c.active_after_ms)),
      el("td", {}, ms(c.detected_after_ms)),
      el("td", { title: "from the failed primary's last heartbeat to the new view's activation" },
         ms(c.outage_ms)),
      el("td", { title: "the new primary's restore, until it served" }, ms(c.takeover_ms))));
  }
  if (changes.length > HISTORY_ROWS) {
    t.append(el("tr", {}, el("td", { colspan: 9 },
      `… ${changes.length - HISTORY_ROWS} earlier changes (all in status.json)`)));
  }
  return t;
}

function service(s, page) {
  const r = s.primary_report;
  const healthClass = s.health === "protected" ? "ok"
    : s.health.startsWith("unavailable") || s.health === "failed" ? "bad" : "warn";
  const figures = r ? `${r.state}; epoch ${r.epoch} (decided ${r.decided}), ` +
    `${Math.round(r.epochs_per_sec)} epochs/s, checkpoint ${bytes(r.checkpoint_bytes)}, ` +
    `pause p50 ${us(r.pause_p50_us)} p99 ${us(r.pause_p99_us)}, lag ${r.backup_lag} epochs, ` +
    `held ${r.held_packets} packets / ${bytes(r.held_bytes)}`
    : page.source === "follower" ? "no figures here: they are the leader's only"
    : "no report from the primary";
  const range = span(s.series, page);
  const role = (label, value, id) =>
    el("div", {}, el("span", {}, label), el("strong", { id }, value));
  return el("section", { class: "service", "data-service": s.name },
    el("h2", {}, `${s.name} `, el("span", { class: healthClass, "data-health": s.health }, s.health)),
    el("div", { class: "roles" },
      role("address", s.address || "–"),
      role("view", `${s.view} (${s.active ? "active" : "proposed"})`, `view-${s.name}`),
      role("primary", s.primary || "–", `primary-${s.name}`),
      role("backups", s.backups.join(", ") || "none", `backups-${s.name}`),
      role("spares", s.spares.join(", ") || "none", `spares-${s.name}`)),
    el("div", { class: "figures" }, figures),
    ...(s.failed ? [el("div", { class: "figures bad", id: `failed-${s.name}` },
      `Given up: ${s.failed}`)] : []),
    ...(s.failures || []).map((f, i) => el("div", { class: "figures" },
      `failure ${i + 1}/${s.max_failures}: ${f.machine} as primary of view ${f.view}: ${f.why}`)),
    el("h3", {}, `Last ${ago(range.t1 - range.t0).slice(1)}` +
                 (s.changes.length ? " (dashed: view changes)" : "")),
    el("div", { class: "plots" }, ...PLOTS.map((p) => plot(p, s.series, s.changes, page, range))),
    el("h3", {}, "View history"),
    history(s.changes));
}

function render(d) {
  const page = d.page;
  const src = document.getElementById("source");
  src.textContent = page.note;
  src.className = "source " + page.source;
  src.dataset.source = page.source;
  document.getElementById("updated").textContent = "updated " + clock(page.now_ms);
  const cl = d.cluster;
  document.getElementById("leader").replaceChildren(
    "leader ", el("strong", { id: "leader-name" }, cl.leader || "unknown"),
    `, term ${cl.term}, log index ${cl.last_log_index} (applied ${cl.last_applied})`);
  const members = el("tbody", {},
    el("tr", {}, ...["node", "address", "role", "reachable"].map((h) => el("th", {}, h))));
  for (const [name, m] of Object.entries(cl.members)) {
    members.append(el("tr", { "data-member": name },
      el("td", {}, name), el("td", {}, m.addr),
      el("td", {}, name === cl.leader ? "leader" : m.voter ? "follower" : "learner"),
      el("td", { class: m.reachable ? "ok" : "bad" }, m.reachable ? "yes" : "no")));
  }
  document.getElementById("members").replaceChildren(members);
  const machines = el("tbody", {},
    el("tr", {}, ...["machine", "address", "state", "services"].map((h) => el("th", {}, h))));
  for (const m of d.machines) {
    // Liveness is the leader's only; a never-heard machine's last_seen_ms is u64::MAX.
    const state = !cl.from_leader ? "unknown" : m.alive ? "alive"
      : m.last_seen_ms >= 1e18 ? "not heard from"
      : `unreachable (last heard ${(m.last_seen_ms / 1000).toFixed(1)} s ago)`;
    machines.append(el("tr", { "data-machine": m.name, "data-alive": m.alive },
      el("td", {}, m.name), el("td", {}, m.api),
      el("td", { class: m.alive ? "ok" : cl.from_leader ? "bad" : "warn" }, state),
      el("td", {}, m.services.join(", ") || "–")));
  }
  document.getElementById("machines").replaceChildren(machines);
  const services = d.services.map((s) => service(s, page));
  document.getElementById("services").replaceChildren(
    ...(services.length ? services : [el("p", {}, "No services deployed (tardi deploy MANIFEST).")]));
}

async function refresh() {
  const err = document.getElementById("error");
  try {
    const r = await fetch("status.json", { cache: "no-store" });
    if (!r.ok) throw new Error(`status.json answered ${r.status}`);
    render(await r.json());
    err.hidden = true;
  } catch (e) {
    err.textContent = `Cannot refresh (${e.message}); showing the last data received.`;
    err.hidden = false;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
