// searchrl trajectory viewer: vanilla JS over the viewer's JSON API, no external code.
// Routes: "#/?source=ID&filters" (the filtered list) and "#/t/<key>?source=ID" (one trajectory, token by
// token). `source` picks the trajectory source (a run's training steps, an evaluation's file); left out,
// it is the first one the server lists.
"use strict";

const app = document.getElementById("app");
const summaries = {};  // per source id: /api/summary?source=ID
let summary = null;    // the current source's summary
let defaultSource = null;
let tokenMode = "kind";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  return Number(x).toFixed(digits);
}

async function getJSON(url) {
  const resp = await fetch(url);
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || body.detail || resp.statusText);
  return body;
}

function showError(err) {
  app.replaceChildren(el("p", { class: "error", id: "error" }, String(err.message || err)));
}

// ---------------------------------------------------------------------------------------- list page

function hashParams() {
  return new URLSearchParams(location.hash.split("?")[1] || "");
}

function currentFilters() {
  const params = hashParams();
  params.delete("source");
  return Object.fromEntries(params.entries());
}

// The source named in the hash, or the server's first one.
function currentSource() {
  return hashParams().get("source") || defaultSource;
}

// "?source=ID" for links and API calls (nothing for the default source, so old links keep working).
function sourceQuery(prefix = "?") {
  const s = currentSource();
  return s && s !== defaultSource ? prefix + "source=" + encodeURIComponent(s) : "";
}

function sourcePicker() {
  const select = el(
    "select",
    { id: "source", name: "source", title: "trajectory source" },
    summary.sources.map((s) =>
      el("option", { value: s.id, selected: s.id === summary.source.id ? "" : null, "data-kind": s.kind }, s.label)),
  );
  select.addEventListener("change", () => {
    go(select.value === defaultSource ? "#/" : "#/?source=" + encodeURIComponent(select.value));
  });
  return el("label", { id: "source-picker" }, "trajectories ", select);
}

function filterForm(values) {
  const option = (v, label, sel) => el("option", { value: v, selected: sel ? "" : null }, label);
  const steps = summary.steps.map((s) => option(String(s), String(s), values.step === String(s)));
  const terms = summary.all_terminations.map((t) => option(t, t, values.termination === t));
  const form = el(
    "form",
    { class: "filters", id: "filters" },
    summary.steps.length ? el("label", {}, "step", el("select", { name: "step" }, option("", "all"), steps)) : null,
    el("label", {}, "min reward", el("input", { name: "min_reward", type: "number", step: "any", value: values.min_reward || "" })),
    el("label", {}, "max reward", el("input", { name: "max_reward", type: "number", step: "any", value: values.max_reward || "" })),
    el("label", {}, "correct (EM)",
      el("select", { name: "correct" }, option("", "any"), option("yes", "yes", values.correct === "yes"), option("no", "no", values.correct === "no"))),
    el("label", {}, "termination", el("select", { name: "termination" }, option("", "any"), terms)),
    el("label", {}, "denied calls",
      el("select", { name: "denied" }, option("", "any"), option("yes", "yes", values.denied === "yes"), option("no", "no", values.denied === "no"))),
    el("label", {}, "text", el("input", { name: "q", type: "search", value: values.q || "" })),
    el("button", { type: "submit" }, "Filter"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const params = new URLSearchParams();
    if (currentSource() !== defaultSource) params.set("source", currentSource());
    for (const [k, v] of new FormData(form).entries()) if (v !== "") params.set(k, v);
    go("#/?" + params.toString());
  });
  return form;
}

async function renderList() {
  const values = currentFilters();
  const params = new URLSearchParams(values);
  if (currentSource()) params.set("source", currentSource());
  const data = await getJSON("/api/trajectories?" + params.toString());
  const link = (r) => "#/t/" + r.key + sourceQuery();
  const rows = data.rows.map((r) =>
    el(
      "tr",
      { class: "traj-row", "data-key": r.key, "data-source": r.source, onclick: () => go(link(r)) },
      el("td", { class: "num" }, r.step === null ? "–" : r.step),
      el("td", {}, el("a", { class: "traj-link", href: link(r) }, r.id)),
      el("td", {}, r.question),
      el("td", {}, r.answer === null ? el("span", { class: "muted" }, "(none)") : r.answer),
      el("td", {}, r.golds.join(" | ")),
      el("td", { class: r.correct ? "yes" : "no" }, r.correct ? "yes" : "no"),
      el("td", { class: "num" }, fmt(r.reward)),
      el("td", {}, r.termination),
      el("td", { class: "num" }, `${r.num_tool_calls}` + (r.failed_tool_calls ? ` (${r.failed_tool_calls} failed)` : ""),
        r.denied_tool_calls ? el("span", { class: "status-bad denied" }, ` ${r.denied_tool_calls} denied`) : null),
      el("td", { class: "num" }, `${r.num_action_tokens}/${r.num_tokens}`),
    ),
  );
  const table = el(
    "table",
    { id: "traj-table" },
    el("thead", {}, el("tr", {}, ["step", "id", "question", "answer", "golds", "correct", "reward", "termination", "tool calls", "action/all tokens"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
  app.replaceChildren(
    el("h2", { id: "source-title" }, summary.source.label),
    filterForm(values),
    el("p", { class: "muted", id: "list-count" }, `${data.total} trajectories match` + (data.total > data.rows.length ? ` (showing ${data.rows.length})` : "")),
    table,
  );
}

// ---------------------------------------------------------------------------------- trajectory page

// Heat-map colour: blue for positive, red for negative, white at 0; `scale` is the largest |value|.
function heat(value, scale) {
  if (value === null || value === undefined || !scale) return "#f2f2f2";
  const a = Math.min(1, Math.abs(value) / scale);
  const [r, g, b] = value >= 0 ? [60, 110, 220] : [215, 60, 60];
  const mix = (c) => Math.round(255 - (255 - c) * a);
  return `rgb(${mix(r)}, ${mix(g)}, ${mix(b)})`;
}

function tokenPane(traj) {
  const pane = el("div", { id: "tokens", "data-mode": tokenMode });
  const key = { advantage: "advantage", kl: "kl", value: "value" }[tokenMode];
  const scale = key ? Math.max(0, ...traj.tokens.map((t) => Math.abs(t[key] || 0))) : 0;
  for (const t of traj.tokens) {
    const cls = ["tok", "tok-" + t.kind];
    if (t.i === traj.score_index) cls.push("score-token");
    const span = el("span", { class: cls.join(" "), "data-i": t.i }, t.text);
    if (key) span.style.background = t.kind === "action" ? heat(t[key], scale) : "#f7f7f7";
    span.dataset.tip =
      `#${t.i} id ${t.id} (${t.kind})\nlogprob ${fmt(t.logprob)}\nadvantage ${fmt(t.advantage)}\nkl ${fmt(t.kl, 4)}\nvalue ${fmt(t.value)}` +
      (t.i === traj.score_index ? `\nscore ${fmt(traj.reward)} placed here` : "");
    pane.append(span);
  }
  return pane;
}

function modeButtons(traj, rerender) {
  const modes = [["kind", "kind"], ["advantage", "advantage"], ["kl", "KL"], ["value", "value"]];
  return el(
    "div",
    { class: "modes", id: "modes" },
    "colour tokens by: ",
    modes.map(([m, label]) =>
      el("button", {
        class: m === tokenMode ? "active" : "",
        "data-mode": m,
        disabled: m !== "kind" && !traj.has_ppo_values ? "" : null,
        onclick: () => { tokenMode = m; rerender(); },
      }, label),
    ),
    traj.has_ppo_values ? null : el("span", { class: "muted" }, " (no per-token PPO values saved in this run)"),
  );
}

function breakdownTable(traj) {
  const entries = Object.entries(traj.reward_breakdown);
  const scale = Math.max(1e-9, ...entries.map(([, v]) => Math.abs(v || 0)));
  return el(
    "table",
    { id: "breakdown" },
    el("thead", {}, el("tr", {}, el("th", {}, "component"), el("th", {}, "value"), el("th", {}, ""))),
    el("tbody", {}, entries.map(([k, v]) =>
      el("tr", {}, el("td", {}, k), el("td", { class: "num" }, fmt(v)),
        el("td", {}, el("span", { class: "bar" + (v < 0 ? " neg" : ""), style: `width:${Math.round((100 * Math.abs(v || 0)) / scale)}px` }))))),
  );
}

function toolTable(traj) {
  if (!traj.tool_calls.length) return el("p", { class: "muted" }, "No tool calls.");
  return el(
    "table",
    { id: "tool-calls" },
    el("thead", {}, el("tr", {}, ["turn", "tool", "arguments", "status", "latency ms", "documents", "error"].map((h) => el("th", {}, h)))),
    el("tbody", {}, traj.tool_calls.map((c) =>
      el("tr", { class: "tool-call" },
        el("td", { class: "num" }, c.turn_index),
        el("td", {}, c.name),
        el("td", {}, el("pre", { class: "args" }, JSON.stringify(c.arguments, null, 1))),
        el("td", { class: c.status === "ok" ? "status-ok" : "status-bad" }, c.status),
        el("td", { class: "num" }, fmt(c.latency_ms, 1)),
        el("td", {}, c.doc_ids.join(", ")),
        el("td", {}, c.error || "")))),
  );
}

async function renderTrajectory(key) {
  const traj = await getJSON("/api/trajectories/" + encodeURIComponent(key) + "?source=" + encodeURIComponent(currentSource()));
  const rerender = () => draw();
  function draw() {
    const kinds = {};
    for (const t of traj.tokens) kinds[t.kind] = (kinds[t.kind] || 0) + 1;
    app.replaceChildren(
      el("p", {}, el("a", { href: "#/" + sourceQuery(), id: "back" }, "← all trajectories of " + summary.source.label)),
      el("section", { id: "overview" },
        el("h2", {}, `Trajectory ${traj.id}` + (traj.step === null ? "" : ` (step ${traj.step})`)),
        el("dl", { class: "kv" },
          el("dt", {}, "question"), el("dd", {}, traj.question),
          el("dt", {}, "golds"), el("dd", {}, traj.golds.join(" | ")),
          el("dt", {}, "answer"), el("dd", { id: "answer" }, traj.answer === null ? "(none)" : traj.answer),
          el("dt", {}, "correct (EM)"), el("dd", { class: traj.correct ? "yes" : "no" }, traj.correct ? "yes" : "no"),
          el("dt", {}, "citations"), el("dd", {}, traj.citations.join(", ") || "–"),
          el("dt", {}, "termination"), el("dd", {}, traj.termination),
          el("dt", {}, "reward"), el("dd", { id: "reward" }, fmt(traj.reward)),
          el("dt", {}, "score placed at"), el("dd", { id: "score-at" }, traj.score_index === null ? "no action token" : `token #${traj.score_index} (the last action token)`),
          el("dt", {}, "turns"), el("dd", {}, traj.num_turns),
          el("dt", {}, "injection attempts"), el("dd", {}, traj.injection_attempts))),
      el("section", {}, el("h2", {}, "Reward breakdown"), breakdownTable(traj)),
      el("section", {}, el("h2", {}, "Tool calls"), toolTable(traj)),
      el("section", {},
        el("h2", {}, "Tokens"),
        el("div", { class: "legend" },
          ["prompt", "action", "observation", "glue"].map((k) => el("span", { class: "tok-" + k }, `${k} (${kinds[k] || 0})`)),
          el("span", { class: "tok score-token" }, "score token")),
        modeButtons(traj, rerender),
        tokenPane(traj)),
    );
  }
  draw();
}

// ------------------------------------------------------------------------------------------ routing

async function loadSummary() {
  if (defaultSource === null) {
    const first = await getJSON("/api/summary");
    defaultSource = first.source.id;
    summaries[defaultSource] = first;
  }
  const id = currentSource();
  if (!summaries[id]) summaries[id] = await getJSON("/api/summary?source=" + encodeURIComponent(id));
  summary = summaries[id];
  document.getElementById("run-name").textContent = `${summary.run} (${summary.kind})`;
  document.getElementById("run-stats").textContent =
    `${summary.num_trajectories} trajectories` + (summary.steps.length ? ` · ${summary.steps.length} steps` : "") +
    ` · ${summary.correct} correct` +
    (summary.tokenizer ? ` · tokens decoded with ${summary.tokenizer}` : " · no tokenizer found");
  const picker = document.getElementById("source-slot");
  picker.replaceChildren(summary.sources.length > 1 ? sourcePicker() : el("span", { id: "source-label" }, summary.source.label));
}

// Navigation clears the "ready" flag before the hash changes: hashchange fires later, and until then a
// reader (a person's script or the headless test) would see the new hash next to the old page marked ready.
function go(hash) {
  if (location.hash === hash) return;
  document.body.dataset.ready = "";
  location.hash = hash;
}

// Links inside the page (the trajectory ids, "back") navigate by their href: the same rule applies to them.
document.addEventListener("click", (ev) => {
  const a = ev.target.closest && ev.target.closest('a[href^="#"]');
  if (a && a.getAttribute("href") !== location.hash) document.body.dataset.ready = "";
}, true);

// Only the latest navigation marks the page ready; an older one that finishes later draws nothing more.
let routeGeneration = 0;

async function route() {
  const generation = ++routeGeneration;
  try {
    await loadSummary();
    const hash = location.hash || "#/";
    if (hash.startsWith("#/t/")) await renderTrajectory(decodeURIComponent(hash.slice(4).split("?")[0]));
    else await renderList();
  } catch (err) {
    if (generation === routeGeneration) showError(err);
  }
  if (generation === routeGeneration) document.body.dataset.ready = "1";
}

const tip = document.body.appendChild(el("div", { id: "tip" }));
document.addEventListener("mousemove", (ev) => {
  const t = ev.target.closest && ev.target.closest(".tok");
  if (!t || !t.dataset.tip) { tip.style.display = "none"; return; }
  tip.textContent = t.dataset.tip;
  tip.style.left = ev.clientX + 14 + "px";
  tip.style.top = ev.clientY + 14 + "px";
  tip.style.display = "block";
});
window.addEventListener("hashchange", () => { document.body.dataset.ready = ""; route(); });
route();
