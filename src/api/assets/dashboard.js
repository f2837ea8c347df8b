// pushpace dashboard: the campaign table with its controls, and a live per-second chart
// of the last 5 minutes for each campaign the worker holds. No build step, no CDN:
// uPlot is served by the binary next to this file.
"use strict";

const WINDOW_S = 300;
const REFRESH_MS = 1000;
const TOKEN_KEY = "pushpace.adminToken";
const COLORS = { sent: "#1f77b4", failed: "#d62728", rate: "#ff7f0e" };

// Exposed for people poking at the page (and for the browser test).
const charts = new Map();
const providerCharts = new Map();
window.pushpace = { charts, providerCharts, refresh: () => tick() };

const $ = (sel) => document.querySelector(sel);
const rows = new Map();

function say(text, kind) {
  const m = $("#message");
  m.textContent = text;
  m.className = kind || "";
}

function fmt(n, digits) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits ?? 0 });
}

function adminToken() {
  let t = sessionStorage.getItem(TOKEN_KEY);
  if (!t) {
    t = window.prompt("Admin token (http.admin_token), kept for this tab only:");
    if (t) sessionStorage.setItem(TOKEN_KEY, t.trim());
  }
  return t ? t.trim() : null;
}

async function mutate(method, path, body) {
  const token = adminToken();
  if (!token) {
    say("No token given: nothing changed.", "error");
    return null;
  }
  const init = { method, headers: { Authorization: "Bearer " + token } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    say("Request failed: " + e, "error");
    return null;
  }
  const json = await res.json().catch(() => ({}));
  if (res.status === 401 || res.status === 403) {
    // A wrong or refused token: ask again next time.
    sessionStorage.removeItem(TOKEN_KEY);
  }
  if (!res.ok) {
    say(json.error || res.status + " " + res.statusText, "error");
    return null;
  }
  return json;
}

const campaignPath = (id) => "/api/campaigns/" + encodeURIComponent(id);

async function setRate(id, input) {
  const rate = Number(input.value);
  if (!input.value || !Number.isFinite(rate) || rate <= 0) {
    say("send_rate must be a number greater than 0", "error");
    return;
  }
  const c = await mutate("PUT", campaignPath(id), { send_rate: rate });
  if (c) {
    say(`${id}: send_rate set to ${fmt(c.send_rate, 3)}/s`, "ok");
    input.value = "";
    tick();
  }
}

async function toggle(id, status) {
  const action = status === "paused" || status === "halted" ? "resume" : "pause";
  const c = await mutate("POST", campaignPath(id) + "/" + action);
  if (c) {
    say(`${id}: ${c.status}`, "ok");
    tick();
  }
}

function cell(tr, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function makeRow(c) {
  const tr = document.createElement("tr");
  tr.dataset.id = c.id;
  const r = { tr };
  r.id = cell(tr, "id");
  r.id.textContent = c.id;
  r.status = cell(tr);
  r.algorithm = cell(tr);
  r.sendRate = cell(tr, "num");
  r.rate10 = cell(tr, "num");
  r.sent = cell(tr, "num");
  r.failed = cell(tr, "num");
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
  r.toggleButton = document.createElement("button");
  r.toggleButton.type = "button";
  r.toggleButton.className = "toggle";
  r.toggleButton.addEventListener("click", () => toggle(tr.dataset.id, r.statusValue));
  controls.append(r.input, " ", r.setButton, " ", r.toggleButton);
  return r;
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
    r.statusValue = c.status;
    r.status.textContent = c.status;
    r.status.className = "status-" + c.status;
    // A halt says why: the provider's answer, for the operator to fix before resuming.
    r.status.title = c.halt_reason || "";
    if (c.halt_reason) r.status.textContent = `halted: ${c.halt_reason}`;
    r.algorithm.textContent = c.algorithm + (c.burst ? ` (burst ${c.burst})` : "") +
      (c.weight !== undefined && c.weight !== 1 ? ` · weight ${fmt(c.weight, 2)}` : "");
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
    r.live.textContent = c.live
      ? (c.live.active ? "active" : "waiting") + (c.live.in_flight ? `, ${c.live.in_flight} in flight` : "")
      : "–";
    r.toggleButton.textContent = c.status === "paused" || c.status === "halted" ? "Resume" : "Pause";
  }
  for (const [id, r] of rows) {
    if (!seen.has(id)) {
      r.tr.remove();
      rows.delete(id);
    }
  }
  $("#no-campaigns").hidden = list.length > 0;
}

// The card's inner width (the grid decides it), so that the canvas fits its card.
function chartWidth(box) {
  const style = getComputedStyle(box);
  const inner = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return Math.max(300, Math.floor(inner));
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
      series: [
        {},
        { label: "sent/s", stroke: COLORS.sent, width: 2, fill: "rgba(31,119,180,0.08)", points: { show: false } },
        { label: "not delivered/s (failed, rejected, invalid)", stroke: COLORS.failed, width: 1, points: { show: false } },
        { label: "send_rate", stroke: COLORS.rate, width: 1.5, dash: [6, 4], points: { show: false } },
      ],
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
  const res = await fetch(campaignPath(c.id) + "/series?last=" + last);
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

let busy = false;
async function tick() {
  if (busy) return;
  busy = true;
  try {
    const res = await fetch("/api/campaigns");
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    const list = await res.json();
    renderTable(list);
    const pres = await fetch("/api/providers");
    if (pres.ok) renderProviders(await pres.json());
    await syncCharts(list);
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("#updated").textContent = "cannot reach the API: " + e.message;
  } finally {
    busy = false;
  }
}

$("#forget-token").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  say("Token forgotten.", "ok");
});
window.addEventListener("resize", () => {
  for (const ch of [...charts.values(), ...providerCharts.values()]) {
    ch.plot.setSize({ width: chartWidth(ch.box), height: 220 });
  }
});
tick();
setInterval(tick, REFRESH_MS);
