// The task list: GET /v1/tasks, filtered by state and worker, a page at a time.

import { get, query } from "./api.js";
import { errorBox, h, pill, replace, short, span, time } from "./dom.js";

const STATES = ["", "leased", "waiting", "free", "done"];
const SIZES = [50, 100, 500];
const EFFECT_STATES = ["completed", "pending", "unknown", "failed"];

function leaseCell(task) {
  const lease = task.lease;
  if (!lease || !lease.live) return h("td", { class: "muted" }, "—");
  return h("td", { "data-expires": lease.expires_at }, leftOf(lease.expires_at));
}

export function leftOf(expires) {
  const left = (Date.parse(expires) - Date.now()) / 1000;
  return left > 0 ? span(left) : "expired";
}

function effectsCell(counts) {
  const parts = EFFECT_STATES.filter((s) => counts[s]).map((s) =>
    h("span", { class: `count st-${s}`, title: `${counts[s]} ${s}` }, `${counts[s]} ${s}`));
  return h("td", { class: "counts" }, parts.length ? parts : h("span", { class: "muted" }, "none"));
}

function row(task) {
  const holder = task.lease?.live ? task.lease.worker : "";
  const state = task.waiting_for_human ? "waiting" : task.state;
  return h("tr", { dataset: { task: task.task } },
    h("th", { scope: "row" }, h("a", { href: `#/task/${encodeURIComponent(task.task)}` }, task.task)),
    h("td", {}, pill(state)),
    h("td", { class: "num" }, task.generation),
    h("td", {}, holder ? short(holder, 28) : h("span", { class: "muted" }, "—")),
    leaseCell(task),
    h("td", {}, task.last_checkpoint ? task.last_checkpoint.stage : h("span", { class: "muted" }, "—")),
    effectsCell(task.effects),
    h("td", { class: "num" }, task.waiting_for_human
      ? h("a", { href: `#/waiting?task=${encodeURIComponent(task.task)}`, class: "warn" },
        `${task.waiting_for_human} effect${task.waiting_for_human > 1 ? "s" : ""}`)
      : h("span", { class: "muted" }, "0")),
    h("td", {}, time(task.updated_at)));
}

export class TasksView {
  constructor(main, params) {
    this.main = main;
    this.filter = {
      state: STATES.includes(params.get("state")) ? params.get("state") : "",
      worker: params.get("worker") || "",
      limit: SIZES.includes(Number(params.get("limit"))) ? Number(params.get("limit")) : 100,
    };
    this.pages = 0;
    this.cursor = null;
  }

  async show() {
    const state = h("select", { id: "f-state", name: "state" },
      STATES.map((x) => h("option", { value: x, selected: x === this.filter.state }, x || "any")));
    const worker = h("input", {
      id: "f-worker", name: "worker", value: this.filter.worker, placeholder: "e.g. worker-a",
      maxlength: 256,
    });
    const limit = h("select", { id: "f-limit", name: "limit" },
      SIZES.map((x) => h("option", { value: x, selected: x === this.filter.limit }, x)));
    const form = h("form", {
      class: "filters", role: "search", "aria-label": "Filter tasks",
      onsubmit: (event) => {
        event.preventDefault();
        const params = query({ state: state.value, worker: worker.value.trim(),
          limit: limit.value === "100" ? "" : limit.value });
        location.hash = `#/tasks${params}`;
      },
    },
    h("label", { for: "f-state" }, "State"), state,
    h("label", { for: "f-worker" }, "Worker"), worker,
    h("label", { for: "f-limit" }, "Per page"), limit,
    h("button", { type: "submit" }, "Filter"));
    this.body = h("tbody", { id: "task-rows" });
    this.more = h("button", { type: "button", hidden: true, onclick: () => this.load(true) }, "Load more");
    this.summary = h("p", { class: "muted", id: "task-summary", role: "status" }, "Loading…");
    this.problem = h("div");
    const headers = ["Task", "State", "Gen", "Lease holder", "Lease left", "Last stage",
      "Effects by state", "Waits for a human", "Updated (UTC)"];
    replace(this.main,
      h("h1", {}, "Tasks"),
      form,
      this.problem,
      h("table", { class: "tasks" },
        h("caption", { class: "sr-only" }, "Tasks, newest first"),
        h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
        this.body),
      this.summary,
      this.more);
    await this.load(false);
  }

  async load(more) {
    const params = query({ ...this.filter, cursor: more ? this.cursor : "" });
    let page;
    try {
      page = await get(`/v1/tasks${params}`);
    } catch (error) {
      replace(this.problem, errorBox(error));
      return;
    }
    replace(this.problem);
    const rows = document.createDocumentFragment();
    for (const task of page.tasks) rows.append(row(task));
    if (more) this.body.append(rows);
    else this.body.replaceChildren(rows);
    this.pages = more ? this.pages + 1 : 1;
    this.cursor = page.next_cursor;
    this.more.hidden = !this.cursor;
    const shown = this.body.children.length;
    this.summary.textContent = shown
      ? `${shown} task${shown > 1 ? "s" : ""} shown${this.cursor ? "; more on the next page" : ""}.`
      : "No task matches.";
  }

  // Live updates re-read the first page only while one page is shown (bounded cost).
  async refresh() {
    if (this.pages <= 1) await this.load(false);
  }
}
