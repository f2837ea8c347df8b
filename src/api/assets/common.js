// pushpace dashboard: what the overview (dashboard.js) and the campaign page
// (campaign.js) share: formatting, the admin token, requests, the in-page dialog and the
// campaign controls. Classic scripts: these names are globals for the later files.
"use strict";

const TOKEN_KEY = "pushpace.adminToken";
const COLORS = { sent: "#1f77b4", failed: "#d62728", rate: "#ff7f0e", mark: "#7b4fc9" };

const $ = (sel) => document.querySelector(sel);

function say(text, kind) {
  const m = $("#message");
  m.textContent = text;
  m.className = kind || "";
}

function fmt(n, digits) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits ?? 0 });
}

// "45 s", "12 min", "3 h 20 min", "2 d 4 h".
function humanSeconds(s) {
  if (s < 1) return "< 1 s";
  if (s < 90) return Math.round(s) + " s";
  const minutes = Math.round(s / 60);
  if (minutes < 90) return minutes + " min";
  const hours = Math.round(s / 3600);
  if (hours < 48) {
    const h = Math.floor(minutes / 60), m = minutes % 60;
    return m ? `${h} h ${m} min` : `${h} h`;
  }
  const d = Math.floor(hours / 24), h = hours % 24;
  return h ? `${d} d ${h} h` : `${d} d`;
}

// A time as the operator reads it: the clock alone when it is today.
function when(iso) {
  const d = new Date(iso);
  const today = d.toDateString() === new Date().toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

// The value a datetime-local input shows for an RFC 3339 time ("" for none).
function localInput(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

const campaignPath = (id) => "/api/campaigns/" + encodeURIComponent(id);

const storedToken = () => (sessionStorage.getItem(TOKEN_KEY) || "").trim() || null;

// Asks for the token once per tab (a plain prompt; the headless test answers it).
function adminToken() {
  let t = storedToken();
  if (!t) {
    t = window.prompt("Admin token (http.admin_token), kept for this tab only:");
    if (t) sessionStorage.setItem(TOKEN_KEY, t.trim());
  }
  return t ? t.trim() : null;
}

// A request with the admin token; null (and a message) when it fails.
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

// The in-page dialog (not window.confirm: a page can be driven and tested with it).
// Resolves to the fields' values by name, {} when there are none, or null if dismissed.
function ask({ title, text, fields = [], ok = "OK", dismiss = "Cancel", danger = false }) {
  const dlg = $("#ask");
  if (dlg.open) return Promise.resolve(null); // one question at a time
  $("#ask-title").textContent = title;
  $("#ask-text").textContent = text || "";
  const box = $("#ask-fields");
  box.replaceChildren();
  const inputs = fields.map((f) => {
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.name = f.name;
    input.type = f.type || "text";
    input.value = f.value ?? "";
    for (const [k, v] of Object.entries(f.attrs || {})) input.setAttribute(k, v);
    label.append(f.label, " ", input);
    box.appendChild(label);
    return input;
  });
  const okButton = $("#ask-ok");
  okButton.textContent = ok;
  okButton.classList.toggle("danger", danger);
  $("#ask-dismiss").textContent = dismiss;
  return new Promise((resolve) => {
    const finish = (value) => {
      okButton.onclick = $("#ask-dismiss").onclick = dlg.oncancel = null;
      if (dlg.open) dlg.close();
      resolve(value);
    };
    okButton.onclick = () => finish(Object.fromEntries(inputs.map((i) => [i.name, i.value.trim()])));
    $("#ask-dismiss").onclick = () => finish(null);
    dlg.oncancel = () => finish(null);
    for (const i of inputs) i.onkeydown = (e) => e.key === "Enter" && okButton.onclick();
    dlg.showModal();
    (inputs[0] || okButton).focus();
  });
}

const refreshSoon = () => window.pushpace && window.pushpace.refresh();

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
    refreshSoon();
  }
}

async function toggle(id, status) {
  const action = status === "paused" || status === "halted" ? "resume" : "pause";
  const c = await mutate("POST", campaignPath(id) + "/" + action);
  if (c) {
    say(`${id}: ${c.status}`, "ok");
    refreshSoon();
  }
}

async function setWeight(c) {
  const got = await ask({
    title: `Weight of ${c.id}`,
    text: "Its share when a cap binds, against the others' weights (0.01 to 100).",
    fields: [{ name: "weight", label: "Weight", type: "number", value: c.weight ?? 1,
               attrs: { min: "0.01", max: "100", step: "any", class: "weight" } }],
    ok: "Set weight",
  });
  if (!got) return;
  const weight = Number(got.weight);
  if (!got.weight || !Number.isFinite(weight) || weight < 0.01 || weight > 100) {
    say("weight must be a number from 0.01 to 100", "error");
    return;
  }
  const r = await mutate("PUT", campaignPath(c.id), { weight });
  if (r) {
    say(`${c.id}: weight set to ${fmt(r.weight ?? weight, 2)}`, "ok");
    refreshSoon();
  }
}

// Start and expiry in one dialog; only what was changed is sent, an emptied one cleared.
async function setSchedule(c) {
  const was = { start_at: localInput(c.start_at), expires_at: localInput(c.expires_at) };
  const got = await ask({
    title: `Schedule of ${c.id}`,
    text: "Nothing is sent before the start; what is not sent by the expiry is counted expired. Empty: none.",
    fields: [
      { name: "start_at", label: "Start", type: "datetime-local", value: was.start_at },
      { name: "expires_at", label: "Expiry", type: "datetime-local", value: was.expires_at },
    ],
    ok: "Set schedule",
  });
  if (!got) return;
  const body = {};
  for (const k of ["start_at", "expires_at"]) {
    if (got[k] !== was[k]) body[k] = got[k] ? new Date(got[k]).toISOString() : null;
  }
  if (!Object.keys(body).length) return;
  const r = await mutate("PUT", campaignPath(c.id), body);
  if (r) {
    say(`${c.id}: schedule set`, "ok");
    refreshSoon();
  }
}

async function cancelCampaign(c) {
  const got = await ask({
    title: `Cancel ${c.id}?`,
    text: "Cancel is final: the devices not sent yet, and those of any later job, are counted cancelled and never sent. Pause stops it for a while instead.",
    ok: "Cancel campaign",
    dismiss: "Keep it",
    danger: true,
  });
  if (!got) return;
  const r = await mutate("POST", campaignPath(c.id) + "/cancel");
  if (r) {
    say(`${c.id}: ${r.status}`, "ok");
    refreshSoon();
  }
}

const isFinal = (status) => status === "cancelled" || status === "done";

// Pause/Resume, Weight…, Schedule… and Cancel for the campaign `current()` returns.
function makeControls(current) {
  const button = (cls, text, action) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = text;
    b.addEventListener("click", () => action(current()));
    return b;
  };
  const el = {
    toggle: button("toggle", "Pause", (c) => toggle(c.id, c.status)),
    weight: button("set-weight", "Weight…", setWeight),
    schedule: button("set-start", "Schedule…", setSchedule),
    cancel: button("cancel", "Cancel…", cancelCampaign),
  };
  el.update = (c) => {
    el.toggle.textContent = c.status === "paused" || c.status === "halted" ? "Resume" : "Pause";
    for (const b of [el.toggle, el.weight, el.schedule, el.cancel]) b.disabled = isFinal(c.status);
  };
  return el;
}

function cell(tr, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

// A progress bar while the total is known, else what is sent and what is known left.
function renderProgress(td, p) {
  td.replaceChildren();
  if (!p) {
    td.textContent = "–";
    return;
  }
  if (typeof p.fraction === "number") {
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.value = p.fraction;
    td.append(bar, " " + fmt(p.fraction * 100, 0) + "%");
    td.title = `${fmt(p.finished ?? p.sent)} of ${fmt(p.total)} devices finished`;
  } else {
    td.textContent = `${fmt(p.sent)} sent · ${fmt(p.known_remaining)} known left`;
    td.title = "the campaign's total is not known: only its jobs read so far";
  }
}

const CLASSES = ["critical", "high", "normal", "bulk"];

// A campaign's priority class as a badge, styled by its name (an unknown name gets the
// plain style; the name itself only ever goes in as text).
function renderClassBadge(el, priority) {
  el.textContent = priority;
  el.className = "badge class-" + (CLASSES.includes(priority) ? priority : "other");
  el.dataset.class = priority;
  el.title = "priority class: served before the classes below it when a cap binds";
}

function etaText(c) {
  const e = c.eta;
  if (!e || isFinal(c.status)) return "–";
  if (e.seconds === null || e.seconds === undefined) return e.rate > 0 ? "–" : "stalled";
  const basis = e.basis === "total" ? "of total" : "known jobs";
  return `~${humanSeconds(e.seconds)} · ${basis}`;
}

function scheduleText(c) {
  const now = Date.now();
  const parts = [];
  if (c.start_at) parts.push((Date.parse(c.start_at) > now ? "starts " : "started ") + when(c.start_at));
  if (c.expires_at) parts.push((Date.parse(c.expires_at) > now ? "expires " : "expired ") + when(c.expires_at));
  return parts.join(" · ") || "–";
}

// The card's inner width (the grid decides it), so that the canvas fits its card.
function chartWidth(box) {
  const style = getComputedStyle(box);
  const inner = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return Math.max(300, Math.floor(inner));
}

// The series of a per-second chart: sends, what was not delivered, the send_rate (fresh
// objects for each chart: uPlot writes into them).
const rateSeries = () => [
  {},
  { label: "sent/s", stroke: COLORS.sent, width: 2, fill: "rgba(31,119,180,0.08)", points: { show: false } },
  { label: "not delivered/s (failed, rejected, invalid)", stroke: COLORS.failed, width: 1, points: { show: false } },
  { label: "send_rate", stroke: COLORS.rate, width: 1.5, dash: [6, 4], points: { show: false } },
];
