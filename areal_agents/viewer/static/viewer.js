// The viewer's page: hand-written, no framework. Every piece of run data reaches the DOM through
// textContent / createTextNode (el() below); nothing built from data is ever parsed as HTML.
"use strict";

const S = { runs: [], metrics: {}, extra: [], page: 0, timer: null, episode: null };
const COLOURS = ["#2a6fdb", "#e67e22", "#27ae60", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d", "#d4ac0d"];
const DASHES = ["", "5 3", "2 2", "8 3 2 3"];
const CHARTS = [
  { title: "Reward (train)", keys: ["rollout/reward"] },
  { title: "Eval success / accuracy", match: (k) => /^eval\/(accuracy|reward|pass@)/.test(k) },
  { title: "Loss", keys: ["train/loss", "train/pg_loss", "train/value_loss"] },
  { title: "KL and entropy", keys: ["train/approx_kl", "train/kl_ref", "train/entropy"] },
  { title: "Clip fraction", keys: ["train/clip_frac", "train/dual_clip_frac"] },
  { title: "Staleness (versions behind)", keys: ["staleness/mean", "staleness/max"] },
  { title: "Episodes/s", keys: ["perf/episodes_per_s"] },
  { title: "Tokens/s", keys: ["perf/gen_tokens_per_s", "perf/train_tokens_per_s"] },
  { title: "Failures by reason", match: (k) => k === "rollout/failed" || k.startsWith("rollout/failed/") },
];
const SVGNS = "http://www.w3.org/2000/svg";

function $(id) { return document.getElementById(id); }

// el("td", {class: "x"}, "text", child): attributes are fixed names set by this file; children are
// nodes or strings, and strings become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

async function api(path, params) {
  const url = path + "?" + new URLSearchParams(params || {}).toString();
  const res = await fetch(url);
  if (!res.ok) throw new Error(path + ": " + res.status + " " + (await res.text()));
  return res.json();
}

function showError(err) { const e = $("error"); e.hidden = !err; e.textContent = err ? String(err.message || err) : ""; }

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number" && !Number.isInteger(v)) return Math.abs(v) >= 1000 || Math.abs(v) < 0.001 && v !== 0 ? v.toExponential(2) : v.toFixed(3);
  return String(v);
}

function episodeHref(run, id) { return "#episode=" + encodeURIComponent(run) + "/" + encodeURIComponent(id); }
function groupHref(run, step, group) { return "#group=" + encodeURIComponent(run) + "/" + step + "/" + encodeURIComponent(group); }

// ---- dashboard -------------------------------------------------------------------------------

async function pollMetrics() {
  let grew = false;
  for (const run of S.runs) {
    const m = S.metrics[run.name];
    try {
      const got = await api("/api/metrics", { run: run.name, offset: m.offset });
      if (got.rows.length) { m.rows.push(...got.rows); grew = true; }
      m.offset = got.offset;
    } catch (err) { showError(err); return; }
  }
  const n = S.runs.map((r) => S.metrics[r.name].rows.length).reduce((a, b) => a + b, 0);
  $("live").textContent = "live: " + n + " metric rows, checked " + new Date().toLocaleTimeString();
  if (grew && !$("view-dashboard").hidden) drawCharts();
}

function numericKeys() {
  const keys = new Set();
  for (const run of S.runs) for (const row of S.metrics[run.name].rows) {
    for (const [k, v] of Object.entries(row)) if (typeof v === "number" && k !== "step") keys.add(k);
  }
  return [...keys].sort();
}

function series(rows, key) {
  const pts = [];
  for (const row of rows) {
    const x = row.step, y = row[key];
    if (typeof x === "number" && typeof y === "number" && Number.isFinite(y)) pts.push([x, y]);
  }
  return pts;
}

function drawChart(title, keys) {
  const W = 400, H = 170, L = 46, R = 8, T = 8, B = 20;
  const lines = [];
  S.runs.forEach((run, ri) => keys.forEach((key, ki) => {
    const pts = series(S.metrics[run.name].rows, key);
    if (pts.length) lines.push({ run: run.name, key, pts, colour: COLOURS[ri % COLOURS.length], dash: DASHES[ki % DASHES.length] });
  }));
  const all = lines.flatMap((l) => l.pts);
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  box.appendChild(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  box.appendChild(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const label = (x, y, text, anchor) => { const t = svg("text", { x, y, "text-anchor": anchor }); t.textContent = text; box.appendChild(t); };
  label(L - 3, T + 8, fmt(y1), "end"); label(L - 3, H - B, fmt(y0), "end");
  label(L, H - 5, "step " + fmt(x0), "start"); label(W - R, H - 5, fmt(x1), "end");
  for (const l of lines) {
    const points = l.pts.map((p) => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ");
    box.appendChild(svg("polyline", { points, stroke: l.colour, "stroke-dasharray": l.dash, "data-run": l.run, "data-key": l.key, "data-n": l.pts.length }));
    if (l.pts.length < 40) for (const p of l.pts) box.appendChild(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2, fill: l.colour }));
  }
  const shown = keys.map((k, i) => (DASHES[i % DASHES.length] ? "- - " : "—— ") + k).join("   ");
  return el("div", { class: "chart", "data-title": title }, el("h4", {}, title), el("div", { class: "keys" }, shown), box);
}

function drawCharts() {
  const present = numericKeys();
  const box = clear($("charts"));
  const defs = [...CHARTS, ...S.extra.map((k) => ({ title: k, keys: [k] }))];
  for (const def of defs) {
    const keys = def.keys ? def.keys.filter((k) => present.includes(k)) : present.filter(def.match);
    if (keys.length) box.appendChild(drawChart(def.title, keys));
  }
  const legend = clear($("legend"));
  S.runs.forEach((run, i) => {
    const swatch = el("i", {});
    swatch.style.background = COLOURS[i % COLOURS.length];
    const item = el("span", {}, swatch, run.name);
    item.title = run.path;
    legend.appendChild(item);
  });
  const pick = $("extra-key");
  if (pick.options.length !== present.length + 1) {
    clear(pick).appendChild(el("option", { value: "" }, "(choose a key)"));
    for (const k of present) pick.appendChild(el("option", { value: k }, k));
  }
}

function drawConfig() {
  const table = clear($("config"));
  const keys = [...new Set(S.runs.flatMap((r) => Object.keys(r.config)))].sort();
  const only = $("config-diff-only").checked && S.runs.length > 1;
  const text = $("config-filter").value.toLowerCase();
  table.appendChild(el("tr", {}, el("th", {}, "key"), ...S.runs.map((r) => el("th", {}, r.name))));
  for (const key of keys) {
    const values = S.runs.map((r) => (key in r.config ? r.config[key] : "(absent)"));
    const differs = new Set(values).size > 1;
    if ((only && !differs) || (text && !key.toLowerCase().includes(text))) continue;
    table.appendChild(el("tr", { class: differs ? "differs" : "" }, el("td", {}, key), ...values.map((v) => el("td", {}, v))));
  }
}

// ---- episodes table --------------------------------------------------------------------------

const COLUMNS = [["step", "step"], ["episode_id", "episode"], ["group_id", "group"], ["env", "env"], ["status", "status"],
  ["reward", "reward"], ["success", "success"], ["n_turns", "turns"], ["n_tokens", "tokens"], ["n_trained", "trained"],
  ["version_min", "versions"], ["staleness", "staleness"], ["prompt", "prompt"]];

let debounce = null;
function scheduleEpisodes(resetPage) {
  if (resetPage) S.page = 0;
  clearTimeout(debounce);
  debounce = setTimeout(loadEpisodes, 200);
}

function fillSelect(select, values) {
  const keep = select.value;
  const fixed = [...select.options].filter((o) => o.value === "" || o.value === "failed").map((o) => o.cloneNode(true));
  clear(select);
  for (const o of fixed) select.appendChild(o);
  for (const v of values) if (v !== "failed") select.appendChild(el("option", { value: v }, v));
  select.value = keep;
}

async function loadEpisodes() {
  const form = new FormData($("filters"));
  const params = { page: S.page, size: 50 };
  for (const [k, v] of form.entries()) if (v !== "") params[k] = v;
  try {
    const got = await api("/api/episodes", params);
    showError(null);
    fillSelect($("f-status"), got.facets.status);
    fillSelect($("f-env"), got.facets.env);
    const pages = Math.max(1, Math.ceil(got.total / got.size));
    $("ep-count").textContent = got.total + " episodes";
    $("page").textContent = "page " + (got.page + 1) + " of " + pages;
    $("prev").disabled = got.page <= 0;
    $("next").disabled = got.page + 1 >= pages;
    const head = clear($("episodes").tHead);
    head.appendChild(el("tr", {}, ...COLUMNS.map((c) => el("th", {}, c[1]))));
    const body = clear($("episodes").tBodies[0]);
    for (const row of got.rows) body.appendChild(episodeRow(params.run, row));
  } catch (err) { showError(err); }
}

function episodeRow(run, row) {
  const cells = COLUMNS.map(([key]) => {
    let v = row[key];
    if (key === "version_min") v = row.version_min === row.version_max ? row.version_min : row.version_min + "–" + row.version_max;
    const td = el("td", { class: key === "prompt" ? "prompt" : key === "status" && v !== "ok" ? "status-bad" : "" },
      key === "prompt" ? String(v || "").slice(0, 160) : fmt(v));
    if (key === "status" && row.failure) td.title = row.failure;
    return td;
  });
  const tr = el("tr", { "data-id": row.episode_id, "data-status": row.status }, ...cells);
  tr.addEventListener("click", () => { location.hash = episodeHref(run, row.episode_id); });
  return tr;
}

// ---- one episode -----------------------------------------------------------------------------

function messageText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (p && typeof p === "object" ? (p.text ?? JSON.stringify(p)) : String(p))).join("");
  return JSON.stringify(content, null, 2);
}

function messageNode(msg, turnNote) {
  const role = String(msg.role || "?");
  const box = el("div", { class: "msg role-" + role.replace(/[^a-z]/g, "") },
    turnNote ? el("span", { class: "turn-reward" }, turnNote) : null,
    el("div", { class: "role" }, role + (msg.name ? " (" + msg.name + ")" : "")),
    el("div", { class: "content" }, messageText(msg.content)));
  for (const call of msg.tool_calls || []) {
    const fn = call.function || call;
    box.appendChild(el("div", { class: "role" }, "tool call: " + (fn.name || "?")));
    box.appendChild(el("pre", { class: "tool-call" }, typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? fn, null, 2)));
  }
  return box;
}

function tokenColour(ep, i, by) {
  const v = (ep[by] || [])[i];
  if (by === "advantages") {
    if (!ep.loss_mask[i] || !v) return "";
    const a = Math.min(1, Math.abs(v) / (ep._maxAdv || 1));
    return v > 0 ? `rgba(39,174,96,${0.15 + 0.6 * a})` : `rgba(192,57,43,${0.15 + 0.6 * a})`;
  }
  if (by === "logprobs") {
    if (!ep.loss_mask[i] && !v) return "";
    const p = Math.exp(v || 0);
    return `rgba(230,126,34,${(0.75 * (1 - p)).toFixed(3)})`;
  }
  if (v === undefined || v < 0) return "";
  const behind = (ep.version_max ?? v) - v;
  return behind <= 0 ? "rgba(42,111,219,0.18)" : `rgba(142,68,173,${Math.min(0.8, 0.2 + 0.2 * behind)})`;
}

function drawTokens(ep) {
  const by = $("colour-by").value;
  const box = clear($("ep-tokens"));
  const n = ep.input_ids.length;
  const cuts = [[0, ep.turn_spans.length ? ep.turn_spans[0][0] : n, "prompt"]];
  ep.turn_spans.forEach(([s, e], k) => {
    cuts.push([s, e, "turn " + (k + 1) + " (generated)"]);
    const next = k + 1 < ep.turn_spans.length ? ep.turn_spans[k + 1][0] : n;
    if (next > e) cuts.push([e, next, k + 1 < ep.turn_spans.length ? "env / tool output" : "after the last turn"]);
  });
  for (const [s, e, label] of cuts) {
    if (e <= s) continue;
    const seg = el("div", { class: "segment" }, el("span", { class: "seg-label" }, label + " · tokens " + s + "–" + e));
    for (let i = s; i < e; i++) {
      const trained = ep.loss_mask[i] ? 1 : 0;
      const span = el("span", { class: trained ? "tok trained" : "tok", "data-i": i, "data-trained": trained },
        ep.token_text[i] ?? "");
      span.title = "id " + ep.input_ids[i] + (trained ? " · trained" : " · not trained") + " · advantage " + fmt(ep.advantages[i]) +
        " · logprob " + fmt(ep.logprobs[i]) + " · version " + ep.versions[i];
      const colour = tokenColour(ep, i, by);
      if (colour) span.style.background = colour;
      seg.appendChild(span);
    }
    box.appendChild(seg);
  }
}

function facts(rows) {
  const list = clear($("ep-facts"));
  for (const [k, v] of rows.filter(Boolean)) list.appendChild(el("div", {}, el("dt", {}, k), el("dd", {}, v)));
}

async function showEpisode(run, id) {
  const ep = await api("/api/episode", { run, id });
  S.episode = ep;
  ep._maxAdv = Math.max(1e-9, ...ep.advantages.map(Math.abs));
  $("ep-title").textContent = run + " / " + ep.episode_id;
  const group = el("a", { href: groupHref(run, ep.step, ep.group_id) }, ep.group_id + " (index " + ep.group_index + ")");
  facts([["step", fmt(ep.step)], ["group", group], ["env", ep.env], ["status", ep.status], ep.failure ? ["failure", ep.failure] : null,
    ["reward (return)", fmt(ep.reward)], ["success", fmt(ep.success)], ["turns", fmt(ep.n_turns)],
    ["tokens / trained", ep.n_tokens + " / " + ep.n_trained], ["weight versions", ep.version_min + " – " + ep.version_max],
    ["staleness", fmt(ep.staleness)], ["link", el("a", { href: episodeHref(run, ep.episode_id) }, "link to this episode")]]);
  const turns = clear($("ep-turns"));
  const spans = ep.turn_spans || [];
  turns.appendChild(el("table", { class: "facts", id: "ep-turn-table" },
    el("tr", {}, ...["turn", "tokens", "trained", "reward", "return"].map((h) => el("th", {}, h))),
    ...spans.map(([s, e], k) => el("tr", {}, el("td", {}, k + 1), el("td", {}, s + "–" + e),
      el("td", {}, ep.loss_mask.slice(s, e).reduce((a, b) => a + b, 0)),
      el("td", {}, fmt((ep.turn_rewards || [])[k])), el("td", {}, fmt((ep.turn_returns || [])[k]))))));
  let k = 0;
  for (const msg of Array.isArray(ep.messages) ? ep.messages : []) {
    let note = null;
    if (msg.role === "assistant") {
      note = "turn " + (k + 1) + " · reward " + fmt((ep.turn_rewards || [])[k]) + " · return " + fmt((ep.turn_returns || [])[k]);
      k += 1;
    }
    turns.appendChild(messageNode(msg, note));
  }
  drawTokens(ep);
  $("ep-info").textContent = JSON.stringify(ep.info, null, 2);
  const calls = Array.isArray(ep.calls) ? ep.calls : [];
  $("ep-calls-box").hidden = calls.length === 0;
  const callBox = clear($("ep-calls"));
  calls.forEach((c, i) => callBox.appendChild(el("div", { class: "msg" }, el("div", { class: "role" }, "call " + (i + 1)),
    el("pre", {}, JSON.stringify(c, null, 2)))));
}

// ---- one group -------------------------------------------------------------------------------

async function showGroup(run, step, group) {
  const rows = await api("/api/group", { run, step, group });
  $("group-title").textContent = run + " · step " + step + " · group " + group + " · " + rows.length + " samples";
  const box = clear($("group"));
  const rewards = rows.map((r) => r.reward);
  for (const r of rows) {
    const trained = r.advantages.filter((_, i) => r.loss_mask[i]);
    const adv = trained.length ? trained.reduce((a, b) => a + b, 0) / trained.length : 0;
    const cls = "card" + (r.reward === Math.max(...rewards) ? " best" : r.reward === Math.min(...rewards) ? " worst" : "");
    const card = el("div", { class: cls, "data-id": r.episode_id },
      el("a", { href: episodeHref(run, r.episode_id) }, r.episode_id),
      el("table", { class: "facts" }, el("tr", {}, el("td", {}, "reward"), el("td", {}, fmt(r.reward))),
        el("tr", {}, el("td", {}, "mean advantage"), el("td", {}, fmt(adv))),
        el("tr", {}, el("td", {}, "status"), el("td", {}, r.status + (r.failure ? ": " + r.failure : ""))),
        el("tr", {}, el("td", {}, "turns"), el("td", {}, fmt(r.n_turns)))));
    const msgs = Array.isArray(r.messages) ? r.messages : [];
    const firstUser = msgs.findIndex((m) => m.role === "user");
    for (const m of msgs.slice(firstUser + 1)) card.appendChild(messageNode(m, null));
    box.appendChild(card);
  }
}

// ---- routing ---------------------------------------------------------------------------------

function show(view) {
  for (const v of ["dashboard", "episodes", "episode", "group"]) $("view-" + v).hidden = v !== view;
  $("nav-dashboard").className = view === "dashboard" ? "active" : "";
  $("nav-episodes").className = view === "episodes" ? "active" : "";
}

async function route() {
  const hash = location.hash.slice(1) || "dashboard";
  try {
    showError(null);
    if (hash.startsWith("episode=")) {
      const rest = hash.slice(8), cut = rest.indexOf("/");
      show("episode");
      await showEpisode(decodeURIComponent(rest.slice(0, cut)), decodeURIComponent(rest.slice(cut + 1)));
    } else if (hash.startsWith("group=")) {
      const parts = hash.slice(6).split("/");
      show("group");
      await showGroup(decodeURIComponent(parts[0]), parts[1], decodeURIComponent(parts.slice(2).join("/")));
    } else if (hash === "episodes") {
      show("episodes");
      await loadEpisodes();
    } else {
      show("dashboard");
      drawCharts();
      drawConfig();
    }
  } catch (err) { showError(err); }
}

async function start() {
  S.runs = await api("/api/runs");
  for (const run of S.runs) {
    S.metrics[run.name] = { rows: [], offset: 0 };
    $("f-run").appendChild(el("option", { value: run.name }, run.name));
  }
  await pollMetrics();
  S.timer = setInterval(pollMetrics, 2000);
  $("filters").addEventListener("input", () => scheduleEpisodes(true));
  $("filters").addEventListener("change", () => scheduleEpisodes(true));
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("prev").addEventListener("click", () => { S.page -= 1; loadEpisodes(); });
  $("next").addEventListener("click", () => { S.page += 1; loadEpisodes(); });
  $("colour-by").addEventListener("change", () => S.episode && drawTokens(S.episode));
  $("config-diff-only").addEventListener("change", drawConfig);
  $("config-filter").addEventListener("input", drawConfig);
  $("extra-key").addEventListener("change", (e) => {
    if (e.target.value && !S.extra.includes(e.target.value)) S.extra.push(e.target.value);
    e.target.value = "";
    drawCharts();
  });
  window.addEventListener("hashchange", route);
  await route();
  document.body.setAttribute("data-ready", "1");
}

document.addEventListener("DOMContentLoaded", () => { start().catch(showError); });
