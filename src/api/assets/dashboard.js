// pushpace dashboard: the summary strip, the campaign table with its controls, a live
// per-second chart of the last 5 minutes for each campaign the worker holds, the
// providers, and the router between this overview, a campaign's page (campaign.js) and
// the apps page (apps.js).
// No build step, no CDN: uPlot is served by the binary next to this file.
"use strict";

const WINDOW_S = 300;
const REFRESH_MS = 1000;

// Exposed for people poking at the page (and for the browser test).
const charts = new Map();
const providerCharts = new Map();
window.pushpace = { charts, providerCharts, campaignPage, appsPage, refresh: () => tick() };

const rows = new Map();

function renderSummary(s) {
  const set = (k, text) => ($(`#summary [data-k="${k}"]`).textContent = text);
  set("sends", fmt(s.sends_per_s, 1));
  set("send-rate-sum", fmt(s.send_rate_sum, 1));
  const cap = s.caps && s.caps.global;
  set("cap", typeof cap === "number" ? ` · global cap ${fmt(cap, 1)}/s` : "");
  for (const k of ["active", "paused", "halted", "scheduled", "cancelled", "done"]) {
    set(k, fmt(s.campaigns[k]));
  }
  set("dead-letters", fmt(s.dead_letters_last_hour));
  const box = $("#summary [data-k=providers]");
  box.replaceChildren();
  for (const p of s.providers || []) {
    const span = document.createElement("span");
    span.className = "provider state-" + p.state.replace(/\s+/g, "-");
    span.dataset.provider = p.name;
    span.textContent = `${p.name}: ${p.state}` + (p.ceiling === null ? "" : ` (ceiling ${fmt(p.ceiling, 1)}/s)`);
    box.appendChild(span);
  }
  if (!box.children.length) box.textContent = "none here";
}

function makeRow(c) {
  const tr = document.createElement("tr");
  tr.dataset.id = c.id;
  const r = { tr, c };
  r.id = cell(tr, "id");
  const link = document.createElement("a");
  link.href = "#/campaign/" + encodeURIComponent(c.id);
  link.textContent = c.id;
  // Its priority class, when it has one other than normal.
  r.badge = document.createElement("span");
  r.badge.hidden = true;
  r.id.append(link, " ", r.badge);
  r.status = cell(tr);
  r.algorithm = cell(tr);
  r.sendRate = cell(tr, "num");
  r.rate10 = cell(tr, "num");
  r.sent = cell(tr, "num");
  r.failed = cell(tr, "num");
  r.progress = cell(tr, "progress");
  r.eta = cell(tr, "eta");
  r.schedule = cell(tr, "schedule");
  r.weight = cell(tr, "num weight");
  r.live = cell(tr);
  const controls = cell(tr, "controls");
  r.input = document.createElement("input");
  r.input.type = "number";
  r.input.min = "0";
  r.input.step = "any";
  r.input.className = "rate";
  r.input.placeholder = "new rate/s";
  r.input.setAttribute("aria-label", "new send_rate for " + c.id);
  r.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") setRate(tr.dataset.id, r.input);
  });
  r.setButton = document.createElement("button");
  r.setButton.type = "button";
  r.setButton.className = "set-rate";
  r.setButton.textContent = "Set rate";
  r.setButton.addEventListener("click", () => setRate(tr.dataset.id, r.input));
  r.controls = makeControls(() => r.c);
  controls.append(r.input, " ", r.setButton, " ", r.controls.toggle, " ", r.controls.weight, " ",
    r.controls.schedule, " ", r.controls.cancel);
  // A click on the row, outside its controls, opens the campaign's page.
  tr.addEventListener("click", (e) => {
    if (!e.target.closest("td.controls, a")) location.hash = link.getAttribute("href");
  });
  return r;
}

function renderRow(r, c) {
  r.c = c;
  r.status.textContent = c.status;
  r.status.className = "status-" + c.status;
  // A halt says why: the provider's answer, for the operator to fix before resuming.
  r.status.title = c.halt_reason || "";
  if (c.halt_reason) r.status.textContent = `halted: ${c.halt_reason}`;
  r.algorithm.textContent = c.algorithm + (c.burst ? ` (burst ${c.burst})` : "");
  r.sendRate.textContent = fmt(c.send_rate, 3);
  // Its share while a cap or its provider's adaptive ceiling binds it.
  const eff = c.live ? c.live.effective_rate : undefined;
  if (typeof eff === "number" && eff < c.send_rate * 0.999) {
    r.sendRate.textContent += ` → ${fmt(eff, 1)}`;
    r.sendRate.title = "effective rate: its share of a cap or provider ceiling that binds";
  } else {
    r.sendRate.title = "";
  }
  r.rate10.textContent = fmt(c.rate_10s, 1);
  r.sent.textContent = fmt(c.sent);
  r.failed.textContent = fmt(c.failed + (c.rejected || 0)) + (c.invalid ? ` (+${fmt(c.invalid)} invalid)` : "");
  renderProgress(r.progress, c.progress);
  const priority = c.policy ? String(c.policy.priority ?? "normal") : "normal";
  renderClassBadge(r.badge, priority);
  r.badge.hidden = priority === "normal";
  const behind = !!(c.policy && c.policy.behind);
  r.eta.textContent = etaText(c) + (behind ? " · behind finish_by" : "");
  r.eta.classList.toggle("behind", behind);
  r.eta.title = "at the rate of the last seconds; known jobs: the devices of the jobs read so far"
    + (behind ? "; it finishes after its finish_by at this rate" : "");
  r.schedule.textContent = scheduleText(c);
  r.schedule.classList.toggle("scheduled", !!c.scheduled);
  r.weight.textContent = fmt(c.weight ?? 1, 2);
  r.live.textContent = c.live
    ? (c.live.active ? "active" : "waiting") + (c.live.in_flight ? `, ${c.live.in_flight} in flight` : "")
    : "–";
  r.controls.update(c);
  r.input.disabled = r.setButton.disabled = isFinal(c.status);
}

function renderTable(list) {
  const body = $("#campaigns tbody");
  const seen = new Set();
  for (const c of list) {
    seen.add(c.id);
    let r = rows.get(c.id);
    if (!r) {
      r = makeRow(c);
      rows.set(c.id, r);
    }
    body.appendChild(r.tr); // keeps the server's order; the input keeps what is typed
    renderRow(r, c);
  }
  for (const [id, r] of rows) {
    if (!seen.has(id)) {
      r.tr.remove();
      rows.delete(id);
    }
  }
  $("#no-campaigns").hidden = list.length > 0;
}

function makeChart(c) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.id = c.id;
  const title = document.createElement("h3");
  title.textContent = c.id;
  box.appendChild(title);
  $("#charts").appendChild(box);
  const ch = { box, title, t: [], sent: [], failed: [], sendRate: c.send_rate, loaded: false };
  ch.plot = new uPlot(
    {
      width: chartWidth(box),
      height: 220,
      scales: {
        x: { time: true },
        y: { range: (u, min, max) => [0, Math.max(max, ch.sendRate * 1.15, 1)] },
      },
      series: rateSeries(),
      axes: [{}, { label: "per second", size: 60 }],
      legend: { live: true },
    },
    [[], [], [], []],
    box
  );
  return ch;
}

// Merges points into a chart's arrays, keyed by second, keeping the last WINDOW_S.
function merge(ch, points) {
  const byT = new Map();
  ch.t.forEach((t, i) => byT.set(t, [ch.sent[i], ch.failed[i]]));
  for (const p of points) byT.set(Date.parse(p.t) / 1000, [p.sent, p.failed + (p.rejected || 0) + (p.invalid || 0)]);
  const ts = [...byT.keys()].sort((a, b) => a - b);
  const keep = ts.slice(Math.max(0, ts.length - WINDOW_S));
  ch.t = keep;
  ch.sent = keep.map((t) => byT.get(t)[0]);
  ch.failed = keep.map((t) => byT.get(t)[1]);
}

async function refreshChart(ch, c) {
  ch.sendRate = c.send_rate;
  ch.title.textContent = `${c.id} · send_rate ${fmt(c.send_rate, 3)}/s · ${c.status}`;
  // The whole window once, then the last seconds (which the flusher may still add to).
  const last = ch.loaded ? "15s" : WINDOW_S + "s";
  const res = await fetch(campaignPath(c.id) + "/series?step=1&last=" + last);
  if (!res.ok) return;
  merge(ch, await res.json());
  ch.loaded = true;
  const rate = ch.t.map(() => ch.sendRate);
  ch.plot.setData([ch.t, ch.sent, ch.failed, rate]);
}

function syncCharts(list) {
  const held = list.filter((c) => c.live);
  const ids = new Set(held.map((c) => c.id));
  for (const [id, ch] of charts) {
    if (!ids.has(id)) {
      ch.plot.destroy();
      ch.box.remove();
      charts.delete(id);
    }
  }
  for (const c of held) {
    if (!charts.has(c.id)) charts.set(c.id, makeChart(c));
  }
  $("#no-charts").hidden = held.length > 0;
  return Promise.all(held.map((c) => refreshChart(charts.get(c.id), c).catch(() => {})));
}

function providerState(p) {
  if (p.state === "paused" && p.paused_until_unix_ms) {
    return "paused until " + new Date(p.paused_until_unix_ms).toLocaleTimeString();
  }
  return p.adaptive ? p.state : "not adaptive";
}

function makeProviderChart(p) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.provider = p.name;
  const title = document.createElement("h3");
  box.appendChild(title);
  $("#provider-charts").appendChild(box);
  const plot = new uPlot(
    {
      width: chartWidth(box),
      height: 220,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max * 1.1, 1)] } },
      series: [
        {},
        { label: "ceiling", stroke: "#9467bd", width: 2, points: { show: false } },
        { label: "summed send_rate", stroke: COLORS.rate, width: 1.5, dash: [6, 4], points: { show: false } },
        { label: "sent/s", stroke: COLORS.sent, width: 1, points: { show: false } },
        { label: "accepted/s", stroke: "#2ca02c", width: 1, points: { show: false } },
      ],
      axes: [{}, { label: "per second", size: 60 }],
    },
    [[], [], [], [], []],
    box
  );
  return { box, title, plot };
}

function renderProviders(list) {
  const body = $("#providers tbody");
  body.replaceChildren();
  for (const p of list) {
    const tr = document.createElement("tr");
    tr.dataset.provider = p.name;
    const last = p.history.length ? p.history[p.history.length - 1] : null;
    const congested = Object.entries(p.congestion).filter(([, n]) => n > 0).map(([s, n]) => `${s} ${fmt(n)}`);
    const cells = [
      p.name,
      p.kind,
      providerState(p),
      p.ceiling === null ? "–" : fmt(p.ceiling, 1),
      last ? fmt(last.demand, 1) : "–",
      last ? fmt(last.achieved) : "–",
      p.p95_ms === null ? "–" : fmt(p.p95_ms, 1) + " ms",
      congested.join(", ") || "none",
    ];
    cells.forEach((text, i) => {
      const td = cell(tr, i >= 3 && i <= 6 ? "num" : undefined);
      td.textContent = text;
      if (i === 2) td.className = "state";
    });
    body.appendChild(tr);
  }
  $("#no-providers").hidden = list.length > 0;
  const names = new Set(list.map((p) => p.name));
  for (const [name, ch] of providerCharts) {
    if (!names.has(name)) {
      ch.plot.destroy();
      ch.box.remove();
      providerCharts.delete(name);
    }
  }
  for (const p of list.filter((p) => p.adaptive)) {
    let ch = providerCharts.get(p.name);
    if (!ch) {
      ch = makeProviderChart(p);
      providerCharts.set(p.name, ch);
    }
    ch.title.textContent = `${p.name} · ${providerState(p)}`;
    const h = p.history;
    // An inactive ceiling is drawn at the summed send_rate: it does not bind.
    ch.plot.setData([
      h.map((x) => x.unix_s),
      h.map((x) => (x.ceiling === null ? x.demand : x.ceiling)),
      h.map((x) => x.demand),
      h.map((x) => x.achieved),
      h.map((x) => x.accepted),
    ]);
  }
}

async function refreshOverview() {
  const res = await fetch("/api/campaigns");
  if (!res.ok) throw new Error(res.status + " " + res.statusText);
  const list = await res.json();
  renderTable(list);
  const pres = await fetch("/api/providers");
  if (pres.ok) renderProviders(await pres.json());
  await syncCharts(list);
}

// "#/campaign/ID" shows that campaign's page, "#/apps" the apps; anything else the
// overview.
function route() {
  const m = location.hash.match(/^#\/campaign\/(.+)$/);
  const id = m ? decodeURIComponent(m[1]) : null;
  const apps = location.hash === "#/apps";
  $("#overview").hidden = id !== null || apps;
  $("#campaign-page").hidden = id === null;
  $("#apps-page").hidden = !apps;
  $("#nav-campaigns").classList.toggle("on", !apps);
  $("#nav-apps").classList.toggle("on", apps);
  if (id === null) {
    closeCampaignPage();
    resizeCharts();
  } else {
    openCampaignPage(id);
  }
  tick();
}

let busy = false;
async function tick() {
  if (busy) return;
  busy = true;
  try {
    const s = await fetch("/api/summary");
    if (s.ok) renderSummary(await s.json());
    if (!$("#apps-page").hidden) await refreshAppsPage();
    else if ($("#campaign-page").hidden) await refreshOverview();
    else await refreshCampaignPage();
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("#updated").textContent = "cannot reach the API: " + e.message;
  } finally {
    busy = false;
  }
}

function resizeCharts() {
  for (const ch of [...charts.values(), ...providerCharts.values()]) {
    ch.plot.setSize({ width: chartWidth(ch.box), height: 220 });
  }
  resizeCampaignChart();
  resizeAppCharts();
}

$("#forget-token").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  say("Token forgotten.", "ok");
});
window.addEventListener("resize", resizeCharts);
window.addEventListener("hashchange", route);
route();
setInterval(tick, REFRESH_MS);
