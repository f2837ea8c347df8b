// pushpace dashboard: the apps page ("#/apps"): each registered app with its kinds'
// status, fingerprint and halt reason, the lane this worker holds for each kind (state,
// ceiling, sends in the last 10 s), the campaigns sending through it, and a per-second
// chart of sends against the ceiling for each kind this worker sends through. The apps
// API needs the admin token: nothing is read until the operator gives it.
"use strict";

const APPS_SHOWN = 200;
const KIND_NAMES = { apns: "APNs", fcm: "FCM", webpush: "Web Push" };

// The page's state, also read by the browser test.
const appsPage = { apps: [], charts: new Map(), cards: new Map(), loaded: 0 };

const appPath = (id) => "/api/apps/" + encodeURIComponent(id);

// A GET with the stored token; null when there is none or it was refused (said so).
async function readWithToken(path) {
  const token = storedToken();
  if (!token) return null;
  const res = await fetch(path, { headers: { Authorization: "Bearer " + token } });
  if (res.status === 401 || res.status === 403) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("#apps-note").textContent = "The admin token was refused.";
    return null;
  }
  if (!res.ok) throw new Error(res.status + " " + res.statusText);
  return { json: await res.json(), next: res.headers.get("x-next-after") };
}

function kindStatus(k) {
  return k.status === "halted" && k.halted_reason ? `halted: ${k.halted_reason}` : k.status;
}

function laneText(live) {
  if (!live) return "no lane in this worker";
  if (live.state === "paused" && live.paused_until_unix_ms) {
    return "paused until " + new Date(live.paused_until_unix_ms).toLocaleTimeString();
  }
  return live.state;
}

function makeAppCard(id) {
  const box = document.createElement("section");
  box.className = "app";
  box.dataset.app = id;
  const title = document.createElement("h3");
  const name = document.createElement("span");
  name.className = "id";
  name.textContent = id;
  const status = document.createElement("span");
  status.className = "app-status";
  title.append(name, " ", status);
  const table = document.createElement("table");
  table.className = "kinds";
  table.innerHTML = "<thead><tr><th>Kind</th><th>Status</th><th>Fingerprint</th><th>Lane</th>"
    + "<th class=\"num\">Ceiling</th><th class=\"num\">max_rate</th>"
    + "<th class=\"num\" title=\"sends dispatched in the last 10 whole seconds, this worker\">Sends, last 10 s</th>"
    + "</tr></thead><tbody></tbody>";
  const campaigns = document.createElement("p");
  campaigns.className = "app-campaigns";
  const charts = document.createElement("div");
  charts.className = "app-charts";
  box.append(title, table, campaigns, charts);
  $("#apps-list").appendChild(box);
  return { box, status, body: table.tBodies[0], campaigns, charts };
}

function renderCampaignLinks(p, ids) {
  p.replaceChildren("Campaigns sending through it: ");
  if (!ids.length) {
    p.append("none");
    return;
  }
  ids.forEach((id, i) => {
    const a = document.createElement("a");
    a.href = "#/campaign/" + encodeURIComponent(id);
    a.textContent = id;
    a.dataset.campaign = id;
    if (i) p.append(", ");
    p.append(a);
  });
}

function renderAppCard(card, app) {
  card.status.textContent = app.status;
  card.status.className = "app-status status-" + app.status;
  card.body.replaceChildren();
  for (const [kind, k] of Object.entries(app.credentials)) {
    const tr = document.createElement("tr");
    tr.dataset.kind = kind;
    const live = k.live;
    const cells = [
      [KIND_NAMES[kind] || kind],
      [kindStatus(k), "status status-" + k.status],
      [k.fingerprint, "fingerprint"],
      [laneText(live), "lane"],
      [live && live.ceiling !== null ? fmt(live.ceiling, 1) + "/s" : "–", "num"],
      [live && live.max_rate !== null ? fmt(live.max_rate, 1) + "/s" : "–", "num"],
      [live ? fmt(live.sends_last_10s) : "–", "num sends"],
    ];
    for (const [text, cls] of cells) cell(tr, cls).textContent = text;
    if (k.halted_reason) tr.title = k.halted_reason;
    card.body.appendChild(tr);
  }
  if (!Object.keys(app.credentials).length) {
    const tr = document.createElement("tr");
    const td = cell(tr, "muted");
    td.colSpan = 7;
    td.textContent = "no credentials";
    card.body.appendChild(tr);
  }
  renderCampaignLinks(card.campaigns, app.campaigns || []);
}

function makeAppChart(card, key) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.lane = key;
  const title = document.createElement("h3");
  box.appendChild(title);
  card.charts.appendChild(box);
  const plot = new uPlot(
    {
      width: chartWidth(box),
      height: 200,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max * 1.1, 1)] } },
      series: [
        {},
        { label: "sent/s", stroke: COLORS.sent, width: 2, fill: "rgba(31,119,180,0.08)", points: { show: false } },
        { label: "ceiling", stroke: COLORS.mark, width: 2, points: { show: false } },
      ],
      axes: [{}, { label: "per second", size: 60 }],
    },
    [[], [], []],
    box
  );
  return { box, title, plot, points: 0 };
}

// The charts of one app's kinds that have a lane here, from its history.
function renderAppCharts(card, app, seen) {
  for (const [kind, k] of Object.entries(app.credentials)) {
    if (!k.live || !k.live.history) continue;
    const key = `app/${app.id}/${kind}`;
    seen.add(key);
    let ch = appsPage.charts.get(key);
    if (!ch) {
      ch = makeAppChart(card, key);
      appsPage.charts.set(key, ch);
    }
    ch.title.textContent = `${KIND_NAMES[kind] || kind} · ${laneText(k.live)}`
      + (k.live.ceiling !== null ? ` · ceiling ${fmt(k.live.ceiling, 1)}/s` : "");
    const h = k.live.history;
    // No ceiling binding: the line is left out (null) rather than drawn at 0.
    ch.plot.setData([h.map((x) => x.unix_s), h.map((x) => x.achieved), h.map((x) => x.ceiling)]);
    ch.points = h.length;
  }
}

function dropApps(keep) {
  for (const [id, card] of appsPage.cards) {
    if (keep.has(id)) continue;
    card.box.remove();
    appsPage.cards.delete(id);
  }
}

function dropCharts(keep) {
  for (const [key, ch] of appsPage.charts) {
    if (keep.has(key)) continue;
    ch.plot.destroy();
    ch.box.remove();
    appsPage.charts.delete(key);
  }
}

async function refreshAppsPage() {
  $("#apps-ask").hidden = !!storedToken();
  const got = await readWithToken(`/api/apps?limit=${APPS_SHOWN}`);
  if (!got) {
    dropApps(new Set());
    dropCharts(new Set());
    return;
  }
  $("#apps-ask").hidden = true;
  const apps = got.json;
  appsPage.apps = apps;
  appsPage.loaded = Date.now();
  $("#apps-note").textContent = apps.length === 0 ? "No app is registered."
    : got.next ? `The first ${APPS_SHOWN} apps; the others: GET /api/apps?after=${got.next}.` : "";
  for (const app of apps) {
    let card = appsPage.cards.get(app.id);
    if (!card) {
      card = makeAppCard(app.id);
      appsPage.cards.set(app.id, card);
    }
    $("#apps-list").appendChild(card.box); // the server's order
    renderAppCard(card, app);
  }
  dropApps(new Set(apps.map((a) => a.id)));
  // Only the apps this worker sends through have a chart: one read each, for its history.
  const sending = apps.filter((a) => Object.values(a.credentials).some((k) => k.live));
  const details = await Promise.all(sending.map((a) => readWithToken(appPath(a.id)).catch(() => null)));
  const seen = new Set();
  details.forEach((d) => {
    const card = d && appsPage.cards.get(d.json.id);
    if (card) renderAppCharts(card, d.json, seen);
  });
  dropCharts(seen);
}

function resizeAppCharts() {
  if ($("#apps-page").hidden) return;
  for (const ch of appsPage.charts.values()) ch.plot.setSize({ width: chartWidth(ch.box), height: 200 });
}

$("#apps-ask").addEventListener("click", () => {
  if (adminToken()) window.pushpace.refresh();
});
