"use strict";
// The fleet page's live part: the server drew the first paint; this keeps it fresh (every 15 s),
// filters it, and opens a GPU's detail (verdicts, evidence, actions, alerts to acknowledge, charts, history).
const MARK = { healthy: "✓", degraded: "!", unhealthy: "✕", unknown: "?" };
const BASE_CHARTS = [["temp_c", "Temperature (°C)"], ["power_w", "Power (W)"], ["util_pct", "Utilisation (%)"]];
// The counters behind a finding in each subsystem: a finding there gets a chart of each.
const FINDING_CHARTS = {
  memory: [["ecc_sbe", "ECC single-bit errors (volatile)"], ["ecc_dbe", "ECC double-bit errors (volatile)"],
           ["retired_pages_sbe", "Retired pages (SBE)"], ["retired_pages_dbe", "Retired pages (DBE)"],
           ["retired_pages_pending", "Pages pending retirement"], ["remapped_rows_uncorrectable", "Remapped rows (uncorrectable)"],
           ["row_remap_failure", "Row remap failure"], ["fb_used_mib", "Framebuffer used (MiB)"]],
  pcie: [["pcie_replay", "PCIe replays"]],
  nvlink: [["nvlink_crc_flit_errors", "NVLink CRC flit errors"], ["nvlink_crc_data_errors", "NVLink CRC data errors"],
           ["nvlink_replay_errors", "NVLink replay errors"], ["nvlink_recovery_errors", "NVLink recovery errors"]],
  xid: [["xid_last", "Last XID"]],
  thermal: [["thermal_violation_us", "Thermal violation (µs)"]],
  power: [["power_violation_us", "Power violation (µs)"]],
  availability: [],
};
let openGpu = null;

class Refused extends Error {}
async function call(path, init) {
  const r = await fetch(path, init);
  if (!r.ok) {
    let detail = "";
    try { detail = (await r.json()).detail || ""; } catch (e) { detail = ""; }
    throw new Refused(`${r.status} ${r.statusText}${detail ? ": " + detail : ""}`);
  }
  return r.json();
}
const api = (path) => call("/api/v1" + path);
const $ = (id) => document.getElementById(id);
const text = (el, value) => { el.textContent = value; return el; };
const make = (tag, cls, value) => { const e = document.createElement(tag); if (cls) e.className = cls; if (value !== undefined) e.textContent = value; return e; };
const utc = (iso) => iso ? iso.slice(0, 16).replace("T", " ") : "–";
const evidence = (ev) => Object.entries(ev || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ") || "–";

function cell(g) {
  const state = g.state || "unknown";
  const c = make("span", "cell " + state);
  const label = `${g.hostname} GPU ${g.gpu_index}: ${g.state || "not scored"}${g.score == null ? "" : ", score " + g.score}`;
  Object.assign(c.dataset, { uuid: g.gpu_uuid, state, host: g.hostname, rack: g.rack || "", model: g.model || "" });
  c.title = label; c.setAttribute("aria-label", label); c.setAttribute("role", "button"); c.tabIndex = 0;
  c.append(make("b", "", MARK[state]), make("i", "", String(g.gpu_index)));
  if (g.gpu_uuid === openGpu) c.classList.add("selected");
  return c;
}

function drawGrid(gpus) {
  const tree = {};
  for (const g of gpus) {
    const dc = g.datacenter || "(no datacenter)", rack = g.rack || "(no rack)";
    ((tree[dc] ??= {})[rack] ??= {})[g.hostname] ??= [];
    tree[dc][rack][g.hostname].push(g);
  }
  const grid = $("grid");
  grid.replaceChildren();
  if (!gpus.length) text(grid, "no GPUs reported yet");
  for (const [dc, racks] of Object.entries(tree)) {
    const d = make("div", "dc"); d.append(make("b", "", dc));
    for (const [rack, hosts] of Object.entries(racks)) {
      const r = make("div", "rack"); r.append(make("div", "", rack));
      for (const [host, list] of Object.entries(hosts)) {
        const h = make("div", "host"); h.dataset.host = host; h.append(make("small", "", host));
        for (const g of list) h.append(cell(g));
        r.append(h);
      }
      d.append(r);
    }
    grid.append(d);
  }
  applyFilter();
}

function applyFilter() {
  const words = $("filter").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const state = $("state-filter").value;
  for (const c of document.querySelectorAll("#grid .cell")) {
    const hay = `${c.dataset.host} ${c.dataset.rack} ${c.dataset.model}`.toLowerCase();
    const shown = words.every((w) => hay.includes(w)) && (!state || c.dataset.state === state);
    c.classList.toggle("hidden", !shown);
  }
  for (const h of document.querySelectorAll("#grid .host")) h.classList.toggle("hidden", !h.querySelector(".cell:not(.hidden)"));
}

// An alert's place: its GPU, or for a job's crash or a host's or rack's fault the job or place with
// all its GPUs and hosts (the alert sits on the first of its GPUs; web.py's where() draws the same).
function where(a) {
  const f = a.shared;
  if (!f) return make("td", "", `${a.hostname || "?"} GPU ${a.gpu_index ?? "?"}`);
  const td = make("td"), span = make("span", "shared", `${f.scope} ${f.key}: ${f.gpu_count} GPUs on ${f.hosts.join(", ")}`);
  span.dataset.scope = f.scope; span.title = f.gpus.join(" ");
  td.append(span);
  return td;
}

function drawAlerts(alerts, total) {
  text($("alert-total"), total);
  const body = document.createElement("tbody");
  if (!alerts.length) { const tr = make("tr"); const td = make("td", "", "no open alerts"); td.colSpan = 5; tr.append(td); body.append(tr); }
  for (const a of alerts) {
    const tr = make("tr"); tr.dataset.uuid = a.gpu_uuid; tr.dataset.alert = a.id;
    tr.append(make("td", a.severity, a.severity), where(a),
              make("td", "", a.summary), make("td", "", a.state), make("td", "", utc(a.opened_at) + " UTC"));
    body.append(tr);
  }
  $("alerts").querySelector("tbody").replaceWith(body);
}

function drawRemediations(modes, plans) {
  // the breaker and the pause of each mode, then the newest plans: pending (held), running, failed...
  text($("remediator"), modes.map(m => `${m.dry_run ? "dry run" : "live"}: ${m.paused ? "paused" : "running"},`
    + ` breaker ${m.breaker}${m.breaker === "open" ? " (" + (m.trip_reason || "") + ")" : ""}`).join(" · "));
  const body = document.createElement("tbody");
  if (!plans.length) { const tr = make("tr"); const td = make("td", "", "none"); td.colSpan = 7; tr.append(td); body.append(tr); }
  for (const p of plans) {
    const tr = make("tr"); tr.dataset.plan = p.id;
    const step = p.step < p.steps.length ? p.steps[p.step] : "end";
    const state = p.state + (p.held_for ? ` (${p.held_for})` : "") + (p.dry_run ? " · dry run" : "");
    tr.append(make("td", "", p.id), make("td", p.state, state), make("td", "", p.node), make("td", "", p.action),
              make("td", "", step), make("td", "", p.finding), make("td", "", utc(p.updated_at) + " UTC"));
    body.append(tr);
  }
  $("remediations").querySelector("tbody").replaceWith(body);
}

function drawLifecycle(body) {
  const said = body.run ? (body.totals.said.length ? body.totals.said : ["every GPU: keep"]) : ["no lifecycle decisions yet"];
  $("lc-said").replaceChildren(...said.flatMap((line, i) => (i ? [make("br"), line] : [line])));
  const money = body.run ? body.run.currency : "";
  const rows = document.createElement("tbody");
  for (const d of body.decisions.filter((x) => x.decision !== "keep")) {
    const tr = make("tr"); tr.dataset.uuid = d.gpu_uuid;
    const decision = make("td"); decision.append(make("b", "", d.decision));
    tr.append(make("td", "", d.hostname || "?"), decision,
              make("td", "", `${d.cost_of_waiting_per_day.toLocaleString("en", { minimumFractionDigits: 2, maximumFractionDigits: 2 })} ${money}`),
              make("td", "", d.why));
    rows.append(tr);
  }
  $("lc-table").querySelector("tbody").replaceWith(rows);
}

async function refresh() {
  const s = await api("/fleet/summary");
  for (const k of ["gpus", "healthy", "degraded", "unhealthy", "missing"]) text($("s-" + k), s[k]);
  text($("s-power"), s.power_w == null ? "–" : Math.round(s.power_w).toLocaleString("en"));
  let gpus = [], cursor = null;
  do {  // a big fleet comes in pages of 1,000
    const page = await api(`/gpus?sort=hostname&limit=1000${cursor ? "&cursor=" + cursor : ""}`);
    gpus = gpus.concat(page.gpus);
    cursor = page.next_cursor;
  } while (cursor);
  drawGrid(gpus);
  const listed = await api("/alerts?state=unresolved&limit=50");
  drawAlerts(listed.alerts, listed.total);
  const [remediator, plans] = await Promise.all([api("/remediator"), api("/remediations?state=all&limit=20")]);
  drawRemediations(remediator.modes, plans.remediations);
  drawLifecycle(await api("/lifecycle?limit=10"));
  if (openGpu) await showGpu(openGpu);
  text($("s-updated"), "live · updated " + new Date().toISOString().slice(11, 19) + " UTC");
}

function svgEl(tag, attrs, content) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (content !== undefined) e.textContent = content;
  return e;
}

function drawChart(box, points, key, from, to) {
  const svg = box.querySelector("svg");
  svg.replaceChildren();
  const w = 320, h = 150, left = 40, bottom = 18, top = 8, right = 6;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const t0 = Date.parse(from), t1 = Date.parse(to), span = Math.max(t1 - t0, 1);
  const present = points.filter((p) => p[key] != null);
  const x = (t) => left + ((Date.parse(t) - t0) / span) * (w - left - right);
  // time axis: five ticks, HH:MM UTC
  svg.append(svgEl("line", { x1: left, y1: h - bottom, x2: w - right, y2: h - bottom }));
  for (let i = 0; i <= 4; i++) {
    const t = new Date(t0 + (span * i) / 4);
    const tx = left + (i / 4) * (w - left - right);
    svg.append(svgEl("line", { x1: tx, y1: h - bottom, x2: tx, y2: h - bottom + 3 }));
    svg.append(svgEl("text", { x: tx, y: h - 4, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle", class: "tick" }, t.toISOString().slice(11, 16)));
  }
  if (!present.length) { svg.append(svgEl("text", { x: left + 8, y: h / 2 }, "no samples in this window")); return; }
  const values = present.map((p) => p[key]);
  const lo = Math.min(...values), hi = Math.max(...values), range = hi - lo || 1;
  const y = (v) => h - bottom - 4 - ((v - lo) / range) * (h - bottom - top - 8);
  svg.append(svgEl("line", { x1: left, y1: top, x2: left, y2: h - bottom }));
  svg.append(svgEl("text", { x: left - 3, y: top + 8, "text-anchor": "end" }, (+hi.toFixed(1)).toLocaleString("en")));
  svg.append(svgEl("text", { x: left - 3, y: h - bottom - 2, "text-anchor": "end" }, (+lo.toFixed(1)).toLocaleString("en")));
  svg.append(svgEl("polyline", { points: present.map((p) => `${x(p.t).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ") }));
}

// Logging in: the token (pasted, or read from the local mode's token file) goes to POST /login, which
// checks it and keeps it in an HttpOnly cookie for the page's reads; writes send it themselves
// (Authorization), so it is also kept for this tab's session. The server records the token's subject.
async function logIn(ev) {
  ev.preventDefault();
  const file = $("token-file").files[0];
  const token = (file ? await file.text() : $("token").value).trim();
  const result = $("login-result");
  try {
    const who = await call("/login", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }) });
    sessionStorage.setItem("gpuhealth-token", token);
    text(result, `signed in as ${who.subject} (${who.role})`);
    location.reload();
  } catch (e) {
    result.className = "err"; text(result, "login refused: " + e.message);
  }
}

async function logOut() {
  sessionStorage.removeItem("gpuhealth-token");
  await fetch("/logout", { method: "POST" });
  location.reload();
}

async function acknowledge(alertId, button) {
  const token = sessionStorage.getItem("gpuhealth-token");
  const result = $("ack-result");
  if (!token) { result.className = "err"; text(result, "log in again in this tab to acknowledge"); return; }
  button.disabled = true;
  try {
    const done = await call(`/api/v1/alerts/${alertId}/acknowledge`, {
      method: "POST", headers: { Authorization: "Bearer " + token },
    });
    result.className = ""; text(result, `alert #${done.id} on ${done.hostname} acknowledged`);
    await refresh();
  } catch (e) {
    result.className = "err"; text(result, `acknowledging #${alertId} was refused: ${e.message}`);
    button.disabled = false;
  }
}

async function showGpu(uuid) {
  openGpu = uuid;
  for (const c of document.querySelectorAll("#grid .cell")) c.classList.toggle("selected", c.dataset.uuid === uuid);
  const enc = encodeURIComponent(uuid);
  const d = await api("/gpus/" + enc);
  const panel = $("detail");
  panel.classList.remove("hidden");
  const st = d.status || {};
  text($("d-title"), `${d.asset.hostname} · GPU ${d.asset.gpu_index} · ${d.asset.model} · rack ${d.asset.rack || "–"} · ${uuid}`);
  const bad = d.verdicts.filter((v) => v.state !== "healthy").map((v) => `${v.subsystem}: ${v.state} (${v.rule})`);
  const p30 = d.prediction ? ` · p(fail in 30 d) ${(100 * d.prediction.p_fail_30d).toFixed(1)} %` : "";
  text($("d-summary"), `${MARK[st.state || "unknown"]} ${st.state || "not scored"}, score ${st.score ?? "–"} (${st.grade || "–"}), ` +
       `action: ${st.action || "none"} — ${bad.join(" · ") || "all subsystems healthy"}${p30}`);
  const actions = Object.fromEntries((st.reasons || []).map((r) => [r.subsystem, r.action]));
  const vbody = document.createElement("tbody");
  for (const v of d.verdicts) {
    const tr = make("tr"); tr.dataset.subsystem = v.subsystem;
    tr.append(make("td", "", v.subsystem), make("td", "st-" + v.state, `${MARK[v.state]} ${v.state}`), make("td", "", v.rule || "–"),
              make("td", "", evidence(v.evidence)), make("td", "", v.state === "healthy" ? "none" : actions[v.subsystem] || st.action || "inspect"),
              make("td", "", utc(v.since)));
    const rung = document.querySelector(`#ladder li[data-action="${tr.children[4].textContent}"]`);
    if (rung) tr.children[4].title = rung.dataset.why;  // why this action, from the ladder on the page
    vbody.append(tr);
  }
  $("d-verdicts").querySelector("tbody").replaceWith(vbody);
  const abody = document.createElement("tbody");
  if (!d.open_alerts.length) abody.append(make("tr", "", "none"));
  for (const a of d.open_alerts) {
    const tr = make("tr"); tr.dataset.alert = a.id;
    const what = a.shared ? ` (${a.shared.scope} ${a.shared.key}: GPUs ${a.shared.gpus.join(" ")}; hosts ${a.shared.hosts.join(", ")})` : "";
    tr.append(make("td", a.severity, a.severity), make("td", "", `#${a.id} ${a.kind}: ${a.summary}${what}`), make("td", "", a.state),
              make("td", "", "evidence: " + evidence(a.evidence)));
    const td = make("td");
    if (a.state === "open") {
      const b = make("button", "ack", "Acknowledge");
      b.addEventListener("click", (ev) => { ev.stopPropagation(); acknowledge(a.id, b); });
      td.append(b);
    } else td.append(`acknowledged by ${a.acknowledged_by || "?"}`);
    tr.append(td);
    abody.append(tr);
  }
  $("d-alerts").querySelector("tbody").replaceWith(abody);
  // charts: the basics, plus every counter behind an open finding (a verdict not healthy, an open alert)
  const findings = new Set(d.verdicts.filter((v) => v.state !== "healthy").map((v) => v.subsystem));
  for (const a of d.open_alerts) if (a.kind.startsWith("unhealthy_")) findings.add(a.kind.slice(10));
  const wanted = [...BASE_CHARTS];
  for (const f of findings) for (const c of FINDING_CHARTS[f] || []) if (!wanted.some((w) => w[0] === c[0])) wanted.push(c);
  const end = d.latest ? new Date(Date.parse(d.latest.time) + 60e3) : new Date();
  const from = new Date(end.getTime() - 6 * 3600e3);
  const series = await api(`/gpus/${enc}/series?bucket=1m&from=${from.toISOString()}&to=${end.toISOString()}`);
  const charts = $("d-charts");
  charts.replaceChildren();
  for (const [key, title] of wanted) {
    const box = make("div", "chart"); box.dataset.metric = key;
    box.append(make("b", "", title), svgEl("svg", {}));
    charts.append(box);
    drawChart(box, series.points, key, series.from, series.to);
  }
  const decided = (await api(`/gpus/${enc}/lifecycle?limit=1`)).decisions[0];
  text($("d-lifecycle"), decided ? `${decided.decision}: ${decided.why}` +
       (decided.missing.length ? ` (missing: ${decided.missing.map((m) => m.input).join("; ")})` : "") : "no lifecycle decision yet");
  const hist = await api(`/gpus/${enc}/history?limit=50`);
  const hbody = document.createElement("tbody");
  if (!hist.history.length) hbody.append(make("tr", "", "no changes recorded"));
  for (const h of hist.history) {
    const tr = make("tr");
    tr.append(make("td", "", utc(h.time)), make("td", "", h.subsystem), make("td", "st-" + h.state, `${MARK[h.state]} ${h.state}`),
              make("td", "", h.rule || "–"), make("td", "", evidence(h.evidence)));
    hbody.append(tr);
  }
  $("d-history").querySelector("tbody").replaceWith(hbody);
  panel.dataset.loaded = uuid;
}

function opener(ev) {
  const target = ev.target.closest("[data-uuid]");
  if (target && (ev.type === "click" || ev.key === "Enter")) showGpu(target.dataset.uuid).catch((e) => text($("d-summary"), "cannot load: " + e.message));
}
$("grid").addEventListener("click", opener);
$("grid").addEventListener("keydown", opener);
$("alerts").addEventListener("click", opener);
$("lc-table").addEventListener("click", opener);
$("filter").addEventListener("input", applyFilter);
$("state-filter").addEventListener("change", applyFilter);
$("login").addEventListener("submit", logIn);
$("logout").addEventListener("click", logOut);
const params = new URLSearchParams(location.search);
if (params.get("q")) $("filter").value = params.get("q");
if (params.get("state")) $("state-filter").value = params.get("state");
applyFilter();
const signedIn = !document.body.classList.contains("anonymous");  // the shell: nothing to refresh
if (signedIn) refresh().catch((e) => text($("s-updated"), "refresh failed: " + e.message));
// Live refresh every 15 s; `/?refresh_s=N` sets another period, and 0 turns it off (a paused screen).
const refreshS = Number(new URLSearchParams(location.search).get("refresh_s") ?? 15);
if (signedIn && refreshS > 0) {
  setInterval(() => refresh().catch((e) => text($("s-updated"), "refresh failed: " + e.message)), refreshS * 1000);
}
