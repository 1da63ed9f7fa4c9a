// One task: its attempts, checkpoints, effects with their audit trails and the writes
// fencing refused, on one time axis (GET /v1/tasks/{task}, .../checkpoints, .../effects).
// Effects and checkpoints come a page at a time; the whole log is never loaded.

import { get, query } from "./api.js";
import { errorBox, h, json, pill, replace, s, short, table, time, when } from "./dom.js";
import { leftOf } from "./tasks.js";

const PAGE = 100;
const LANE = 34;
const LEFT = 190;
const WIDTH = 1000;
const EVENT_SHAPE = { pending: "ring", blocked: "ring", waited: "ring" };

export class TaskView {
  constructor(main, task) {
    this.main = main;
    this.task = task;
    this.effects = [];
    this.checkpoints = [];
    this.effectCursor = null;
    this.checkpointCursor = null;
    this.selected = null;
  }

  get base() {
    return `/v1/tasks/${encodeURIComponent(this.task)}`;
  }

  async show() {
    this.head = h("div");
    this.problem = h("div");
    this.timeline = h("figure", { class: "timeline" });
    this.attempts = h("div");
    this.effectList = h("div");
    this.detail = h("section", { class: "detail", id: "effect-detail", "aria-label": "Effect detail", hidden: true });
    this.checkpointList = h("div");
    this.refusals = h("div");
    this.moreEffects = h("button", { type: "button", hidden: true, onclick: () => this.loadEffects(true) },
      "Load more effects");
    this.moreCheckpoints = h("button", { type: "button", hidden: true, onclick: () => this.loadCheckpoints(true) },
      "Load more checkpoints");
    replace(this.main,
      h("p", { class: "crumbs" }, h("a", { href: "#/tasks" }, "Tasks"), " / ", this.task),
      this.head, this.problem,
      h("h2", {}, "Timeline"), this.timeline,
      h("div", { class: "split" },
        h("div", {},
          h("h2", {}, "Effects and their audit trail"), this.effectList, this.moreEffects),
        this.detail),
      h("h2", {}, "Attempts"), this.attempts,
      h("h2", {}, "Checkpoints"), this.checkpointList, this.moreCheckpoints,
      h("h2", {}, "Writes refused by fencing"), this.refusals);
    await this.reload();
  }

  async reload() {
    try {
      const [view, checkpoints, effects] = await Promise.all([
        get(this.base),
        get(`${this.base}/checkpoints${query({ limit: PAGE })}`),
        get(`${this.base}/effects${query({ limit: PAGE })}`),
      ]);
      this.view = view;
      this.checkpoints = checkpoints.checkpoints;
      this.checkpointCursor = checkpoints.next_cursor;
      this.effects = effects.effects;
      this.effectCursor = effects.next_cursor;
      this.effectPages = 1;
      this.checkpointPages = 1;
    } catch (error) {
      replace(this.problem, errorBox(error));
      return;
    }
    replace(this.problem);
    this.render();
  }

  async loadEffects() {
    try {
      const page = await get(`${this.base}/effects${query({ limit: PAGE, cursor: this.effectCursor })}`);
      this.effects = this.effects.concat(page.effects);
      this.effectCursor = page.next_cursor;
      this.effectPages += 1;
    } catch (error) {
      replace(this.problem, errorBox(error));
      return;
    }
    this.render();
  }

  async loadCheckpoints() {
    try {
      const page = await get(`${this.base}/checkpoints${query({ limit: PAGE, cursor: this.checkpointCursor })}`);
      this.checkpoints = this.checkpoints.concat(page.checkpoints);
      this.checkpointCursor = page.next_cursor;
      this.checkpointPages += 1;
    } catch (error) {
      replace(this.problem, errorBox(error));
      return;
    }
    this.render();
  }

  // Live updates re-read the task and first pages while only those are shown.
  async refresh() {
    if (this.effectPages <= 1 && this.checkpointPages <= 1) await this.reload();
  }

  render() {
    const v = this.view;
    const waiting = v.effects.unknown || 0;
    const live = v.lease && v.lease.live;
    replace(this.head,
      h("h1", {}, "Task ", h("span", { class: "mono" }, v.task), " ",
        pill(v.done ? "done" : waiting ? "waiting" : live ? "leased" : "free")),
      h("dl", { class: "facts" },
        h("dt", {}, "Generation"), h("dd", {}, v.generation),
        h("dt", {}, "Lease"), h("dd", {}, live
          ? [v.lease.worker, " (", h("span", { "data-expires": v.lease.expires_at }, leftOf(v.lease.expires_at)), " left)"]
          : "none live"),
        h("dt", {}, "Last stage"), h("dd", {}, v.last_checkpoint ? v.last_checkpoint.stage : "—"),
        h("dt", {}, "Effects"), h("dd", {}, Object.entries(v.effects).filter(([, n]) => n)
          .map(([state, n]) => h("span", { class: `count st-${state}` }, `${n} ${state}`))),
        h("dt", {}, "Waits for a human"), h("dd", {}, waiting
          ? h("a", { class: "warn", href: `#/waiting?task=${encodeURIComponent(v.task)}` }, `${waiting} effect(s): resolve`)
          : "nothing"),
        v.done ? [h("dt", {}, "Done"), h("dd", {}, `${when(v.done.at)} by ${v.done.by}`)] : null));
    this.renderTimeline();
    this.renderEffects();
    this.renderAttempts();
    this.renderCheckpoints();
    this.renderRefusals();
    if (this.selected) {
      const found = this.effects.find((e) => e.key === this.selected);
      if (found) this.showEffect(found, false);
    }
  }

  lanes() {
    // One lane per attempt, by generation; events of an unknown attempt (a human's
    // resolution) go on an operator lane.
    const lanes = [...this.view.attempts].sort((a, b) => a.generation - b.generation)
      .map((a) => ({ id: a.attempt_id, attempt: a }));
    const known = new Set(lanes.map((l) => l.id));
    const strays = this.effects.some((e) => e.events.some((ev) => !known.has(ev.attempt_id)));
    if (strays) lanes.push({ id: "*", attempt: null });
    return lanes;
  }

  renderTimeline() {
    const lanes = this.lanes();
    const index = new Map(lanes.map((l, i) => [l.id, i]));
    const laneOf = (attemptId) => index.get(attemptId) ?? index.get("*") ?? 0;
    const now = Date.now();
    const times = [];
    for (const a of this.view.attempts) {
      times.push(Date.parse(a.claimed_at));
      if (a.ended_at) times.push(Date.parse(a.ended_at));
    }
    for (const e of this.effects) for (const ev of e.events) times.push(Date.parse(ev.at));
    for (const c of this.checkpoints) times.push(Date.parse(c.created_at));
    for (const r of this.view.refused_writes) times.push(Date.parse(r.at));
    if (this.view.lease?.live) times.push(now);
    if (!times.length) {
      replace(this.timeline, h("p", { class: "muted" }, "No attempt yet."));
      return;
    }
    let t0 = Math.min(...times);
    let t1 = Math.max(...times);
    if (t1 - t0 < 1000) { t0 -= 500; t1 += 500; }
    const pad = (t1 - t0) * 0.02;
    t0 -= pad; t1 += pad;
    const x = (t) => LEFT + ((t - t0) / (t1 - t0)) * (WIDTH - LEFT - 10);
    const y = (lane) => 34 + lane * LANE;
    const height = 44 + lanes.length * LANE;
    const svg = s("svg", {
      viewBox: `0 0 ${WIDTH} ${height}`, class: "tl", role: "img",
      "aria-label": `Timeline of task ${this.task}: ${lanes.length} attempt lane(s), ` +
        `${this.effects.length} effect(s), ${this.view.refused_writes.length} refused write(s). ` +
        "The tables below hold the same facts.",
    });
    for (let i = 0; i <= 4; i++) {
      const t = t0 + ((t1 - t0) * i) / 4;
      svg.append(s("line", { x1: x(t), x2: x(t), y1: 14, y2: height - 6, class: "grid" }),
        s("text", { x: x(t), y: 10, class: "tick", "text-anchor": i === 4 ? "end" : "middle" },
          new Date(t).toISOString().slice(11, 19)));
    }
    lanes.forEach((lane, i) => {
      const a = lane.attempt;
      const label = a ? `gen ${a.generation} · ${short(a.worker, 14)}` : "operator";
      svg.append(s("text", { x: 6, y: y(i) + 4, class: "lane-label", "data-label": label }, label,
        s("title", {}, a ? `${a.attempt_id} (${a.how || "running"})` : "resolutions by a human")));
      if (a) {
        const start = Date.parse(a.claimed_at);
        const end = a.ended_at ? Date.parse(a.ended_at) : a.how === "current" ? now : Date.parse(a.lease_until || a.claimed_at);
        svg.append(s("rect", {
          x: x(start), y: y(i) - 8, width: Math.max(2, x(end) - x(start)), height: 16, rx: 3,
          class: `span ${a.how === "current" ? "current" : "ended"}`,
        }, s("title", {}, `${a.attempt_id}: claimed ${when(a.claimed_at)}, ${a.how || "ended"}`)));
      }
    });
    for (const e of this.effects) {
      for (const ev of e.events) {
        const cx = x(Date.parse(ev.at));
        const cy = y(laneOf(ev.attempt_id));
        svg.append(s("circle", {
          cx, cy, r: 5, tabindex: "-1",
          class: `ev ev-${ev.event} ${EVENT_SHAPE[ev.event] || ""}`,
          "data-event": ev.event, "data-key": e.key,
          onclick: () => this.showEffect(e, true),
        }, s("title", {}, `${e.key}: ${ev.event} by ${ev.attempt_id} (gen ${ev.generation}) at ${when(ev.at)}`)));
      }
    }
    for (const r of this.view.refused_writes) {
      const cx = x(Date.parse(r.at));
      const cy = y(laneOf(r.attempt_id));
      svg.append(s("path", { d: `M${cx - 6} ${cy - 6}l12 12m0-12l-12 12`, class: "refused", "data-event": "refused" },
        s("title", {}, `refused ${r.operation}: generation ${r.generation} < ${r.current_generation} at ${when(r.at)} (${r.reason})`)));
    }
    // Checkpoints sit just above their attempt's lane, clear of the effect markers.
    for (const c of this.checkpoints) {
      const cx = x(Date.parse(c.created_at));
      const cy = y(laneOf(c.attempt_id)) - 12;
      svg.append(s("path", { d: `M${cx} ${cy - 5}l5 5-5 5-5-5z`, class: "checkpoint", "data-event": "checkpoint" },
        s("title", {}, `checkpoint ${c.seq} ${c.stage} at ${when(c.created_at)}`)));
    }
    const legend = h("figcaption", { class: "legend" },
      ["recorded", "completed", "replayed", "probed", "unknown", "failed", "resolved", "blocked"]
        .map((ev) => h("span", {}, h("i", { class: `dot ev-${ev === "recorded" ? "pending" : ev}` }), ev === "recorded" ? "pending (recorded before forwarding)" : ev)),
      h("span", {}, h("i", { class: "dot diamond" }), "checkpoint"),
      h("span", {}, h("i", { class: "dot cross" }), "write refused (stale generation)"));
    replace(this.timeline, svg, legend);
  }

  renderEffects() {
    if (!this.effects.length) {
      replace(this.effectList, h("p", { class: "muted" }, "No effect recorded."));
      this.moreEffects.hidden = true;
      return;
    }
    const rows = this.effects.map((e) => h("tr", { class: e.key === this.selected ? "selected" : "", dataset: { key: e.key } },
      h("th", { scope: "row" }, h("button", { type: "button", class: "link mono", onclick: () => this.showEffect(e, true) }, short(e.key, 60))),
      h("td", {}, pill(e.state)),
      h("td", {}, short(e.rule, 28)),
      h("td", { class: "trail" }, e.events.map((ev) =>
        h("span", { class: `chip ev-${ev.event}`, title: `${ev.attempt_id} at ${when(ev.at)}${ev.detail ? `: ${ev.detail}` : ""}` },
          `${ev.event} g${ev.generation}`)))));
    replace(this.effectList, table(["Effect key", "State", "Rule", "Audit trail (attempt generation)"], rows));
    this.moreEffects.hidden = !this.effectCursor;
  }

  showEffect(e, focus) {
    this.selected = e.key;
    for (const tr of this.effectList.querySelectorAll("tr[data-key]")) {
      tr.classList.toggle("selected", tr.dataset.key === e.key);
    }
    const r = e.request || {};
    const heading = h("h2", { tabindex: "-1" }, "Effect ", h("span", { class: "mono" }, short(e.key, 80)));
    replace(this.detail,
      heading,
      h("button", { type: "button", class: "close", "aria-label": "Close effect detail",
        onclick: () => { this.detail.hidden = true; this.selected = null; } }, "×"),
      h("dl", { class: "facts" },
        h("dt", {}, "State"), h("dd", {}, pill(e.state)),
        h("dt", {}, "Rule"), h("dd", {}, `${e.rule} (${e.kind})`),
        h("dt", {}, "First issued by"), h("dd", { class: "mono" }, e.origin_attempt_id),
        h("dt", {}, "Last driven by"), h("dd", { class: "mono" }, `${e.attempt_id} (gen ${e.generation})`),
        h("dt", {}, "Idempotency key"), h("dd", { class: "mono" }, e.idempotency_key || "none sent"),
        e.detail ? [h("dt", {}, "Detail"), h("dd", {}, e.detail)] : null),
      h("h3", {}, "Request (secrets redacted)"),
      h("p", { class: "mono" }, r.method ? `${r.method} ${r.url}` : ""),
      json(r),
      h("h3", {}, "Recorded response"),
      e.response ? json(e.response) : h("p", { class: "muted" }, "none recorded"),
      h("h3", {}, "Audit trail"),
      table(["Event", "Attempt", "Gen", "At (UTC)", "Detail"], e.events.map((ev) => h("tr", {},
        h("td", {}, h("span", { class: `chip ev-${ev.event}` }, ev.event)),
        h("td", { class: "mono" }, ev.attempt_id), h("td", { class: "num" }, ev.generation),
        h("td", {}, when(ev.at)), h("td", {}, ev.detail || "")))));
    this.detail.hidden = false;
    if (focus) heading.focus();
  }

  renderAttempts() {
    const counts = new Map();
    for (const e of this.effects) for (const ev of e.events) counts.set(ev.attempt_id, (counts.get(ev.attempt_id) || 0) + 1);
    const rows = [...this.view.attempts].sort((a, b) => b.generation - a.generation).map((a) => h("tr", {},
      h("td", { class: "num" }, a.generation),
      h("td", { class: "mono" }, a.attempt_id),
      h("td", {}, a.worker),
      h("td", {}, time(a.claimed_at)),
      h("td", {}, a.ended_at ? time(a.ended_at) : "—"),
      h("td", {}, a.how || "—"),
      h("td", { class: "num" }, counts.get(a.attempt_id) || 0)));
    replace(this.attempts, rows.length
      ? table(["Gen", "Attempt", "Worker", "Claimed (UTC)", "Ended (UTC)", "How it ended", "Audit events"], rows)
      : h("p", { class: "muted" }, "No attempt."));
  }

  renderCheckpoints() {
    const rows = this.checkpoints.map((c) => h("tr", {},
      h("td", { class: "num" }, c.seq), h("td", {}, c.stage), h("td", { class: "num" }, c.generation),
      h("td", { class: "mono" }, c.attempt_id), h("td", {}, time(c.created_at)),
      h("td", { class: "mono" }, short(JSON.stringify(c.outputs), 80))));
    replace(this.checkpointList, rows.length
      ? table(["Seq", "Stage", "Gen", "Attempt", "At (UTC)", "Outputs"], rows)
      : h("p", { class: "muted" }, "No checkpoint."));
    this.moreCheckpoints.hidden = !this.checkpointCursor;
  }

  renderRefusals() {
    const rows = this.view.refused_writes.map((r) => h("tr", { class: "refused-row" },
      h("td", {}, time(r.at)), h("td", {}, r.operation), h("td", { class: "mono" }, r.attempt_id),
      h("td", { class: "num" }, r.generation), h("td", { class: "num" }, r.current_generation),
      h("td", {}, r.reason)));
    replace(this.refusals, rows.length
      ? table(["At (UTC)", "Operation", "Attempt", "Its gen", "Current gen", "Reason"], rows)
      : h("p", { class: "muted" }, "None: no stale worker wrote after losing its lease."));
  }
}
