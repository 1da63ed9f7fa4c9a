// The console's entry point: routes (#/tasks, #/task/ID, #/waiting, #/review, #/rules)
// and live updates by polling, with a bound on cost: one refresh of the view shown and
// one count of what waits for a human every 5 s, only while the tab is visible and not
// paused, backing off to 60 s while the sidecar does not answer.

import { get } from "./api.js";
import { h, replace } from "./dom.js";
import { ReviewView } from "./review.js";
import { RulesView } from "./rules.js";
import { TaskView } from "./task.js";
import { leftOf, TasksView } from "./tasks.js";
import { WaitingView } from "./waiting.js";

const EVERY_MS = 5000;
const SLOWEST_MS = 60000;

let view = null;
let paused = false;
let delay = EVERY_MS;
let timer = null;

function route() {
  const [path, search] = (location.hash.slice(1) || "/tasks").split("?");
  const params = new URLSearchParams(search || "");
  const main = document.getElementById("main");
  const parts = path.split("/").filter(Boolean);
  const name = parts[0] || "tasks";
  for (const link of document.querySelectorAll("nav a")) {
    const here = link.dataset.view === name || (name === "task" && link.dataset.view === "tasks");
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (name === "task" && parts[1]) view = new TaskView(main, decodeURIComponent(parts[1]));
  else if (name === "waiting") view = new WaitingView(main, params);
  else if (name === "review") view = new ReviewView(main, params);
  else if (name === "rules") view = new RulesView(main);
  else view = new TasksView(main, params);
  document.title = `${name === "task" ? `task ${decodeURIComponent(parts[1])}` : name} · effect-sidecar`;
  const shown = view;
  return shown.show().then(() => {
    if (shown !== view) return;
    // The moment the view's data is on screen: what the first-paint benchmark reads.
    performance.mark(`ready-${name}`);
    document.body.dataset.ready = name;
  });
}

async function countWaiting() {
  const badge = document.getElementById("waiting-count");
  const page = await get("/v1/effects?state=unknown&limit=100");
  const n = page.effects.length;
  badge.hidden = n === 0;
  badge.textContent = page.next_cursor ? `${n}+` : String(n);
  badge.setAttribute("aria-label", `${badge.textContent} waiting`);
}

function status(text) {
  document.getElementById("live-status").textContent = text;
}

async function tick() {
  timer = null;
  if (!paused && !document.hidden) {
    try {
      await Promise.all([view ? view.refresh() : null, countWaiting()]);
      delay = EVERY_MS;
      status(`live · updated ${new Date().toISOString().slice(11, 19)} UTC`);
    } catch {
      delay = Math.min(delay * 2, SLOWEST_MS);
      status(`sidecar not answering · retry in ${delay / 1000} s`);
    }
  }
  timer = setTimeout(tick, delay);
}

// Lease countdowns move every second without asking the sidecar.
function countdown() {
  for (const cell of document.querySelectorAll("[data-expires]")) cell.textContent = leftOf(cell.dataset.expires);
}

function start() {
  const toggle = document.getElementById("live-toggle");
  toggle.addEventListener("click", () => {
    paused = !paused;
    toggle.setAttribute("aria-pressed", String(paused));
    toggle.textContent = paused ? "Resume updates" : "Pause updates";
    status(paused ? "paused" : "live");
  });
  window.addEventListener("hashchange", () => {
    document.body.dataset.ready = "";
    route();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && !timer) tick();
  });
  route().catch((error) => replace(document.getElementById("main"), h("p", { class: "error" }, String(error))));
  countWaiting().catch(() => {});
  status("live");
  timer = setTimeout(tick, delay);
  setInterval(countdown, 1000);
}

start();
