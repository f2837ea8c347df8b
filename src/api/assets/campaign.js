// pushpace dashboard: one campaign's page ("#/campaign/ID"): its settings and controls,
// its delivery policy (class, ramp, deadline against the projected finish, send window),
// its counts, its per-second chart over 5 min, 1 h or 24 h (the server sums long ranges
// into steps) with its settings changes as vertical marks, the history of those changes,
// and its dead letters once the admin token is known.
"use strict";

// How often each range's series is read again.
const RANGES = { "5m": 1000, "1h": 10000, "24h": 60000 };
const EVENTS_EVERY_MS = 5000;
const DEAD_LETTERS_EVERY_MS = 10000;
const DEAD_LETTERS_SHOWN = 50;

// The page's state, also read by the browser test.
const campaignPage = {
  id: null,
  range: "5m",
  campaign: null,
  points: [],
  step: 1,
  events: [],
  marks: 0,
  plot: null,
  loaded: { series: 0, events: 0, dead: 0 },
};

function resetCampaignPage(id) {
  const p = campaignPage;
  Object.assign(p, { id, campaign: null, points: [], step: 1, events: [], marks: 0 });
  p.loaded = { series: 0, events: 0, dead: 0 };
  $("#cp-id").textContent = id;
  $("#cp-missing").hidden = true;
  $("#cp-app").textContent = "–";
  $("#cp-waiting").hidden = true;
  for (const el of document.querySelectorAll("#campaign-page [data-k]")) el.textContent = "–";
  resetPolicy();
  $("#cp-events").replaceChildren();
  $("#cp-no-events").hidden = false;
  $("#cp-dead tbody").replaceChildren();
  $("#cp-dead").hidden = true;
  $("#cp-dead-note").textContent = "";
  if (p.plot) p.plot.setData([[], [], [], []]);
}

function openCampaignPage(id) {
  if (!campaignPage.controls) {
    campaignPage.controls = makeControls(() => campaignPage.campaign || { id: campaignPage.id });
    const c = campaignPage.controls;
    $("#cp-controls").append(c.toggle, " ", c.weight, " ", c.schedule, " ", c.cancel);
    makePolicyFacts();
  }
  if (campaignPage.id !== id) resetCampaignPage(id);
  if (!campaignPage.plot) campaignPage.plot = makeCampaignPlot();
  showRange();
}

function closeCampaignPage() {
  campaignPage.id = null;
}

function makeCampaignPlot() {
  const box = $("#cp-chart");
  return new uPlot(
    {
      width: chartWidth(box),
      height: 280,
      scales: {
        x: { time: true },
        y: { range: (u, min, max) => [0, Math.max(max * 1.05, 1)] },
      },
      series: rateSeries(),
      axes: [{}, { label: "per second", size: 60 }],
      hooks: { draw: [drawMarks] },
    },
    [[], [], [], []],
    box
  );
}

function resizeCampaignChart() {
  const p = campaignPage;
  if (p.plot && !$("#campaign-page").hidden) {
    p.plot.setSize({ width: chartWidth($("#cp-chart")), height: 280 });
  }
}

// Settings changes grouped by second: one mark each, named by its fields ("created"
// for the row's first values, which have no old ones).
function markGroups(events) {
  const groups = new Map();
  for (const e of events) {
    const t = Math.floor(Date.parse(e.at) / 1000);
    if (!groups.has(t)) groups.set(t, []);
    groups.get(t).push(e);
  }
  return [...groups].map(([t, es]) => ({
    t,
    label: es.every((e) => e.old === null) ? "created" : es.map((e) => e.field).join(", "),
  }));
}

// A dashed vertical line, with its label, at each settings change in view.
function drawMarks(u) {
  const ctx = u.ctx;
  const { min, max } = u.scales.x;
  let drawn = 0;
  ctx.save();
  ctx.strokeStyle = ctx.fillStyle = COLORS.mark;
  ctx.lineWidth = 2;
  ctx.setLineDash([5, 4]);
  ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
  for (const m of markGroups(campaignPage.events)) {
    if (!(m.t >= min && m.t <= max)) continue;
    const x = Math.round(u.valToPos(m.t, "x", true));
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
    // Labels go right of their line, or left of it near the right edge.
    const w = ctx.measureText(m.label).width;
    const left = x + 4 + w > u.bbox.left + u.bbox.width;
    ctx.fillText(m.label, left ? x - 4 - w : x + 4, u.bbox.top + 12 * devicePixelRatio * (1 + (drawn % 3)));
    drawn++;
  }
  ctx.restore();
  campaignPage.marks = drawn;
}

// The send_rate in force at `t` (unix s), from the history of its changes.
function rateAt(t, changes, current) {
  let rate = changes.length ? Number(changes[0].old ?? changes[0].new) : current;
  for (const e of changes) {
    if (Date.parse(e.at) / 1000 <= t) rate = Number(e.new);
  }
  return Number.isFinite(rate) ? rate : current;
}

// Each bucket's sums as a mean per second, so every range reads in the same unit.
function drawCampaignChart() {
  const p = campaignPage;
  if (!p.plot || !p.campaign) return;
  const step = p.step || 1;
  const changes = p.events.filter((e) => e.field === "send_rate");
  const t = p.points.map((x) => Date.parse(x.t) / 1000);
  p.plot.setData([
    t,
    p.points.map((x) => x.sent / step),
    p.points.map((x) => (x.failed + (x.rejected || 0) + (x.invalid || 0)) / step),
    t.map((s) => rateAt(s, changes, p.campaign.send_rate)),
  ]);
  $("#cp-step").textContent = step > 1 ? `one point per ${humanSeconds(step)} (mean per second)` : "one point per second";
}

// A response for a range the user has since left is dropped: applied, it would stand
// for the new range until that range's next reload.
async function loadSeries(id) {
  const range = campaignPage.range;
  const res = await fetch(campaignPath(id) + "/series?last=" + range);
  if (!res.ok || campaignPage.id !== id || campaignPage.range !== range) return;
  const points = await res.json();
  if (campaignPage.id !== id || campaignPage.range !== range) return;
  const header = Number(res.headers.get("x-series-step"));
  const gap = points.length > 1 ? (Date.parse(points[1].t) - Date.parse(points[0].t)) / 1000 : 1;
  campaignPage.step = header > 0 ? header : gap;
  campaignPage.points = points;
  campaignPage.loaded.series = Date.now();
  // Drawn now, so that the chart never shows one range's points under another's step.
  drawCampaignChart();
}

function eventValue(field, v) {
  if (v === null || v === undefined) return "none";
  if (field === "start_at" || field === "expires_at" || field === "finish_by") return when(v);
  return v;
}

async function loadEvents(id) {
  campaignPage.loaded.events = Date.now();
  const res = await fetch(campaignPath(id) + "/events");
  if (!res.ok || campaignPage.id !== id) return;
  const events = await res.json();
  campaignPage.events = events;
  const list = $("#cp-events");
  list.replaceChildren();
  for (const e of events) {
    const li = document.createElement("li");
    li.dataset.field = e.field;
    const at = document.createElement("time");
    at.dateTime = e.at;
    at.textContent = when(e.at);
    li.append(at, ` ${e.actor}: ${e.field} ${eventValue(e.field, e.old)} → ${eventValue(e.field, e.new)}`);
    list.appendChild(li);
  }
  $("#cp-no-events").hidden = events.length > 0;
}

async function loadDeadLetters(id) {
  const token = storedToken();
  if (!token) return;
  campaignPage.loaded.dead = Date.now();
  const q = `/api/dead-letters?campaign=${encodeURIComponent(id)}&limit=${DEAD_LETTERS_SHOWN}`;
  const res = await fetch(q, { headers: { Authorization: "Bearer " + token } });
  if (campaignPage.id !== id) return;
  if (res.status === 401 || res.status === 403) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("#cp-dead-note").textContent = "The admin token was refused.";
    return;
  }
  if (!res.ok) return;
  const page = await res.json();
  const body = $("#cp-dead tbody");
  body.replaceChildren();
  for (const d of page.items) {
    const tr = document.createElement("tr");
    tr.dataset.id = d.id;
    const cells = [when(d.created_at), d.kind, d.job_id ?? "–", d.device ?? "–", d.reason];
    for (const text of cells) cell(tr).textContent = text;
    body.appendChild(tr);
  }
  $("#cp-dead").hidden = false;
  $("#cp-dead-note").textContent = page.items.length === 0 ? "None."
    : page.next_before ? `The newest ${DEAD_LETTERS_SHOWN}; older ones: GET /api/dead-letters.` : "";
}

function renderCampaignHead(c) {
  const set = (k, text) => ($(`#campaign-page [data-k="${k}"]`).textContent = text);
  const status = $("#cp-status");
  status.textContent = c.halt_reason ? `halted: ${c.halt_reason}` : c.status;
  status.className = "status-" + c.status;
  set("send_rate", fmt(c.send_rate, 3) + "/s");
  set("weight", fmt(c.weight ?? 1, 2));
  set("algorithm", c.algorithm + (c.burst ? ` (burst ${c.burst})` : ""));
  set("schedule", scheduleText(c));
  set("eta", etaText(c));
  set("rate_10s", fmt(c.rate_10s, 1) + "/s");
  renderProgress($("#cp-progress"), c.progress);
  renderCampaignApp(c.live);
  renderPolicy(c);
  for (const k of ["sent", "failed", "rejected", "invalid", "expired", "cancelled", "retried"]) {
    set(k, fmt(c[k] ?? 0));
  }
  campaignPage.controls.update(c);
}

// The delivery policy's elements: a class badge by the status, a row of facts under the
// settings and the next window per time zone. Built here, once: the page's HTML has no
// place for them. Every value from the API goes in as text, never as markup.
function makePolicyFacts() {
  const badge = document.createElement("span");
  badge.id = "cp-class";
  badge.className = "badge";
  badge.hidden = true;
  $("#cp-status").after(" ", badge);
  const box = document.createElement("div");
  box.id = "cp-policy";
  box.className = "facts policy";
  const fact = (k, label) => {
    const span = document.createElement("span");
    span.dataset.fact = k;
    const b = document.createElement("b");
    b.dataset.k = k;
    b.textContent = "–";
    span.append(label + " ", b);
    box.appendChild(span);
    return span;
  };
  fact("ramp", "ramp");
  const finish = fact("finish_by", "finish by");
  const behind = document.createElement("span");
  behind.id = "cp-behind";
  behind.className = "behind";
  behind.textContent = "behind";
  behind.title = "at the rate it sends, it finishes after its finish_by";
  behind.hidden = true;
  finish.append(" ", behind);
  fact("starved", "starved").hidden = true;
  fact("window", "window").hidden = true;
  fact("deliver_at", "deliver at").hidden = true;
  fact("late_policy", "late").hidden = true;
  const next = document.createElement("div");
  next.id = "cp-next-windows";
  next.className = "next-windows";
  next.hidden = true;
  const label = document.createElement("span");
  label.className = "label";
  label.textContent = "Next window, by device time zone";
  next.append(label, document.createElement("ul"));
  $("#campaign-page .facts").after(box, next);
}

function resetPolicy() {
  const badge = $("#cp-class");
  if (!badge) return;
  badge.hidden = true;
  badge.textContent = "";
  $("#cp-behind").hidden = true;
  for (const k of ["starved", "window", "deliver_at", "late_policy"]) {
    $(`#cp-policy [data-fact="${k}"]`).hidden = true;
  }
  $("#cp-next-windows").hidden = true;
  $("#cp-next-windows ul").replaceChildren();
}

const DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

const percent = (f) => fmt(f * 100, 1) + "%";

// Its ramp as set (null: the worker's limiter.ramp_up_s / ramp_from) and, while it
// ramps, the fraction of its send_rate it may use now.
function rampText(p, live) {
  const from = p.ramp_from === null || p.ramp_from === undefined ? null : percent(p.ramp_from);
  let text;
  if (p.ramp_up_s === null || p.ramp_up_s === undefined) {
    text = from ? `default length from ${from}` : "default";
  } else if (p.ramp_up_s <= 0) {
    text = "none";
  } else {
    text = `${humanSeconds(p.ramp_up_s)} from ${from || "default start"}`;
  }
  if (live && typeof live.ramp === "number") text += ` · now ${percent(live.ramp)}`;
  return text;
}

function finishText(p) {
  const projected = p.projected_finish ? "projected " + when(p.projected_finish) : "";
  if (!p.finish_by) return projected ? "none · " + projected : "none";
  return when(p.finish_by) + " · " + (projected || (p.behind ? "passed" : "no projection"));
}

function windowText(w) {
  if (w === null) return "any hour";
  if (typeof w !== "object") return String(w);
  const days = Array.isArray(w.days) ? w.days.map(String) : [];
  const all = days.length === 0 || DAYS.every((d) => days.includes(d));
  return `${w.from ?? "?"}–${w.to ?? "?"} local, ${all ? "every day" : days.join(", ")}`;
}

function renderPolicy(c) {
  const p = c.policy;
  if (!p || !$("#cp-class")) return;
  const set = (k, text) => {
    const b = $(`#cp-policy [data-k="${k}"]`);
    b.textContent = text;
    return b;
  };
  const show = (k, on) => ($(`#cp-policy [data-fact="${k}"]`).hidden = !on);
  const badge = $("#cp-class");
  renderClassBadge(badge, String(p.priority ?? "normal"));
  badge.hidden = false;
  const live = c.live;
  set("ramp", rampText(p, live)).classList.toggle("ramping", !!live && typeof live.ramp === "number");
  $("#cp-policy [data-k=ramp]").title = "null settings follow the worker's limiter.ramp_up_s and limiter.ramp_from";
  set("finish_by", finishText(p)).classList.toggle("behind", !!p.behind);
  $("#cp-behind").hidden = !p.behind;
  const starved = live && typeof live.starved_ms === "number" ? live.starved_ms : null;
  show("starved", starved !== null);
  if (starved !== null) {
    set("starved", humanSeconds(starved / 1000)).title = "with work but no share of the cap: higher classes take it";
  }
  // An API with send windows always shows late_policy, and leaves send_window and
  // deliver_at_local out while they are not set.
  const windows = "late_policy" in p || "send_window" in p;
  const sendWindow = p.send_window ?? null;
  const at = p.deliver_at_local ?? null;
  show("window", windows);
  if (windows) set("window", windowText(sendWindow));
  show("deliver_at", at !== null);
  if (at !== null) set("deliver_at", String(at) + " local");
  // What is done with a late send only matters with a window or a deliver time.
  const late = windows && (sendWindow !== null || at !== null) && p.late_policy != null;
  show("late_policy", late);
  if (late) set("late_policy", String(p.late_policy).replace(/_/g, " "));
  renderNextWindows(Array.isArray(p.next_windows) ? p.next_windows : []);
}

function renderNextWindows(list) {
  const ul = $("#cp-next-windows ul");
  ul.replaceChildren();
  for (const w of list) {
    const li = document.createElement("li");
    const zone = document.createElement("span");
    zone.className = "zone";
    zone.textContent = String(w.zone ?? "?");
    li.dataset.zone = zone.textContent;
    const span = (iso) => (iso ? when(iso) : "–");
    li.append(zone, ` opens ${span(w.opens)} · closes ${span(w.closes)}`);
    ul.appendChild(li);
  }
  $("#cp-next-windows").hidden = list.length === 0;
}

// The app its sends go through (as the worker here holds it), and why they wait for it.
function renderCampaignApp(live) {
  const box = $("#cp-app");
  const app = live && live.app_id;
  if (app) {
    const a = document.createElement("a");
    a.href = "#/apps";
    a.dataset.app = app;
    a.textContent = app;
    box.replaceChildren(a);
    box.title = "";
  } else {
    box.textContent = live ? "none (static provider)" : "–";
    box.title = live ? "" : "not held by the worker in this process";
  }
  const waiting = $("#cp-waiting");
  waiting.textContent = (live && live.waiting_for_app) || "";
  waiting.hidden = !waiting.textContent;
}

async function refreshCampaignPage() {
  const id = campaignPage.id;
  const res = await fetch(campaignPath(id));
  if (campaignPage.id !== id) return;
  if (res.status === 404) {
    $("#cp-missing").hidden = false;
    return;
  }
  if (!res.ok) throw new Error(res.status + " " + res.statusText);
  const c = await res.json();
  campaignPage.campaign = c;
  renderCampaignHead(c);
  const now = Date.now();
  const reads = [];
  if (now - campaignPage.loaded.events >= EVENTS_EVERY_MS) reads.push(loadEvents(id));
  if (now - campaignPage.loaded.series >= RANGES[campaignPage.range]) reads.push(loadSeries(id));
  if (now - campaignPage.loaded.dead >= DEAD_LETTERS_EVERY_MS) reads.push(loadDeadLetters(id));
  await Promise.all(reads);
  $("#cp-dead-ask").hidden = !!storedToken();
  drawCampaignChart();
}

function showRange() {
  for (const b of document.querySelectorAll("#cp-ranges button")) {
    b.classList.toggle("on", b.dataset.last === campaignPage.range);
  }
}

for (const b of document.querySelectorAll("#cp-ranges button")) {
  b.addEventListener("click", () => {
    campaignPage.range = b.dataset.last;
    campaignPage.loaded.series = 0;
    showRange();
    window.pushpace.refresh();
  });
}

$("#cp-dead-ask").addEventListener("click", () => {
  if (adminToken()) {
    campaignPage.loaded.dead = 0;
    window.pushpace.refresh();
  }
});
