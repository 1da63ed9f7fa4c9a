// The review for a chosen period: its figures (GET /v1/review) and the report with its
// charts (GET /v1/review/report, the HTML `sidecar review --out` writes), shown in a
// sandboxed frame that runs no script.

import { get, getText, query } from "./api.js";
import { errorBox, h, replace, table, when } from "./dom.js";

const PERIODS = ["24h", "7d", "30d", "90d", "365d"];

function figure(label, value, note) {
  return h("div", { class: "figure" }, h("span", { class: "value" }, value), h("span", { class: "label" }, label),
    note ? h("span", { class: "note" }, note) : null);
}

export class ReviewView {
  constructor(main, params) {
    this.main = main;
    this.since = PERIODS.includes(params.get("since")) ? params.get("since") : "30d";
  }

  async show() {
    const since = h("select", { id: "r-since" }, PERIODS.map((p) => h("option", { value: p, selected: p === this.since }, p)));
    this.figures = h("div", { class: "figures", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
    this.report = h("div");
    replace(this.main,
      h("h1", {}, "Review"),
      h("form", { class: "filters", onsubmit: (event) => {
        event.preventDefault();
        location.hash = `#/review${query({ since: since.value })}`;
      } }, h("label", { for: "r-since" }, "Since"), since, h("button", { type: "submit" }, "Show")),
      this.figures, this.report);
    await this.load();
  }

  async load() {
    let review;
    let html;
    try {
      [review, html] = await Promise.all([
        get(`/v1/review${query({ since: this.since })}`),
        getText(`/v1/review/report${query({ since: this.since })}`, "text/html"),
      ]);
    } catch (error) {
      replace(this.figures, errorBox(error));
      return;
    }
    const d = review.duplicates;
    const hu = review.humans;
    const le = review.leases;
    const cw = review.checkpoint_write?.samples;
    replace(this.figures,
      h("p", { class: "muted" }, `From ${when(review.window.since)} to ${when(review.window.until)}.`),
      h("div", { class: "cards" },
        figure("duplicates prevented (replays)", d.replays, `${d.divergent_replays} divergent, ${d.divergent_rejected} rejected`),
        figure("waited for a human", hu.waited, `${hu.waiting_now} waiting now; ` +
          (Object.entries(hu.settled).map(([k, n]) => `${n} ${k}`).join(", ") || "none settled")),
        figure("writes no rule covered", review.uncovered.total),
        figure("stale writes refused", review.refusals.total,
          Object.entries(review.refusals.by_operation).map(([k, n]) => `${n} ${k}`).join(", ")),
        figure("stages near their lease", le.near_lease, `${le.over_lease} over it, of ${le.stages} stages`),
        figure("checkpoint write p95", cw && cw.p95_ms != null ? `${cw.p95_ms} ms` : "—", cw ? `${cw.count} samples` : "")),
      hu.settlements.length ? table(["At (UTC)", "Task", "Effect", "Outcome", "By", "Note"], hu.settlements.map((x) =>
        h("tr", {}, h("td", {}, when(x.at)), h("td", {}, x.task), h("td", { class: "mono" }, x.key),
          h("td", {}, x.outcome), h("td", {}, x.by), h("td", {}, x.note))), "How they were settled") : null);
    const frame = h("iframe", { title: "Review report with charts", class: "report", sandbox: "", srcdoc: html });
    replace(this.report, h("h2", {}, "Report and charts"), frame);
  }

  // The review reads a whole period: not re-read on every tick, only when asked.
  async refresh() {}
}
