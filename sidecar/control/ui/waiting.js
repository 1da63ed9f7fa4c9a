// What waits for a human: every effect the sidecar could not settle (GET
// /v1/effects?state=unknown), with its rule, the evidence it has, the probe it would send
// (POST /v1/rules/explain), and the resolve action - the route the CLI's `sidecar effects
// resolve` uses (POST /v1/tasks/{task}/effects/{key}/resolve).

import { get, post, query } from "./api.js";
import { errorBox, h, json, pill, replace, short, time, when } from "./dom.js";

const PAGE = 50;
const BY = "effect-sidecar.by";
const CONSEQUENCE = {
  completed: "it happened: later attempts are answered with the response given here, and nothing is sent.",
  failed: "it did not happen: the next attempt sends it again, with the first idempotency key.",
  abandoned: "it must not happen: later attempts get 409 effect_abandoned.",
};

function probeText(explained, rule) {
  const found = explained?.http;
  if (!found) return "cannot tell: the effect log's record is not an HTTP request";
  const probe = found.probe;
  if (!probe) {
    return rule && rule.on_unknown !== "probe"
      ? `none: the rule says on_unknown: ${rule.on_unknown} (no evidence check is possible)`
      : "none";
  }
  if (probe.builtin) return probe.builtin;
  if (probe.error) return probe.error;
  return `${probe.method} ${probe.host}${probe.path} — found if ${probe.found}, answered as ${probe.answer_status}`;
}

function idempotencyText(e, explained) {
  const header = explained?.http?.idempotency?.header;
  if (!e.idempotency_key) return "none";
  return header ? `${e.idempotency_key} (sent as ${header})`
    : `${e.idempotency_key} (not sent: the rule names no idempotency_header)`;
}

function explainBody(request) {
  // The effect log's record, back into an explain request (redacted values stay redacted).
  if (!request || !request.method || !request.url) return null;
  const headers = {};
  for (const [name, value] of Object.entries(request.headers || {})) {
    if (typeof value === "string" && !value.includes("[redacted]")) headers[name] = value;
  }
  const asked = { method: request.method, url: request.url, headers };
  if (request.body !== undefined) asked.body = request.body;
  return asked;
}

export class WaitingView {
  constructor(main, params) {
    this.main = main;
    this.task = params.get("task") || "";
    this.cursor = null;
    this.pages = 0;
    this.rules = null;
    this.open = new Set(); // effects whose resolve form is being filled: not redrawn live
  }

  async show() {
    this.list = h("div", { id: "waiting-list" });
    this.problem = h("div");
    this.more = h("button", { type: "button", hidden: true, onclick: () => this.load(true) }, "Load more");
    replace(this.main,
      h("h1", {}, "Waiting for a human"),
      h("p", { class: "lead" }, "Effects whose outcome the sidecar could not settle (CANNOT DETERMINE): ",
        "no probe can check them and the API takes no idempotency key. Look at the outside world, then ",
        "resolve each one. Every resolution is kept in the audit trail with who and why."),
      this.task ? h("p", {}, `Only task ${this.task}. `, h("a", { href: "#/waiting" }, "Show every task")) : null,
      this.problem, this.list, this.more);
    await this.load(false);
  }

  async ruleset() {
    if (!this.rules) {
      try {
        const listed = await get("/v1/rules");
        this.rules = new Map(listed.rules.map((r) => [r.name, r]));
      } catch {
        this.rules = new Map();
      }
    }
    return this.rules;
  }

  async load(more) {
    let page;
    try {
      page = await get(`/v1/effects${query({ state: "unknown", task: this.task, limit: PAGE, cursor: more ? this.cursor : "" })}`);
    } catch (error) {
      replace(this.problem, errorBox(error));
      return;
    }
    replace(this.problem);
    const rules = await this.ruleset();
    const cards = await Promise.all(page.effects.map((e) => this.card(e, rules.get(e.rule))));
    if (more) this.list.append(...cards);
    else if (!this.open.size) {
      replace(this.list, cards.length ? cards : h("p", { class: "ok-note", role: "status" },
        "Nothing waits for a human."));
    }
    this.pages = more ? this.pages + 1 : 1;
    this.cursor = page.next_cursor;
    this.more.hidden = !this.cursor;
  }

  async refresh() {
    if (this.pages <= 1 && !this.open.size) await this.load(false);
  }

  async card(e, rule) {
    let explained = null;
    const asked = explainBody(e.request);
    if (asked) {
      try { explained = await post("/v1/rules/explain", asked); } catch { explained = null; }
    }
    const r = e.request || {};
    const last = e.events[e.events.length - 1];
    const id = `w-${btoa(unescape(encodeURIComponent(`${e.task}\n${e.key}`))).replace(/[^A-Za-z0-9]/g, "")}`;
    return h("article", { class: "card", "aria-labelledby": `${id}-h`, dataset: { key: e.key, task: e.task } },
      h("h2", { id: `${id}-h` }, h("span", { class: "mono" }, short(e.key, 90)), " ", pill(e.state)),
      h("dl", { class: "facts" },
        h("dt", {}, "Task"), h("dd", {}, h("a", { href: `#/task/${encodeURIComponent(e.task)}` }, e.task)),
        h("dt", {}, "Rule"), h("dd", {}, rule ? `${e.rule} (${rule.at}), on_unknown: ${rule.on_unknown}` : e.rule),
        h("dt", {}, "Waiting since"), h("dd", {}, time(e.updated_at)),
        h("dt", {}, "Why unknown"), h("dd", {}, e.detail || (last ? `${last.event}: ${last.detail || ""}` : "—")),
        h("dt", {}, "Last attempt"), h("dd", { class: "mono" }, `${e.attempt_id} (gen ${e.generation})`),
        h("dt", {}, "Request"), h("dd", { class: "mono" }, r.method ? `${r.method} ${r.url}` : "—"),
        h("dt", {}, "Idempotency key"), h("dd", { class: "mono" }, idempotencyText(e, explained)),
        h("dt", {}, "Evidence"), h("dd", {}, e.response
          ? `the upstream answered ${e.response.status} (${e.response.body_bytes} bytes) — not proof it happened`
          : "no answer recorded"),
        h("dt", {}, "Probe it would send"), h("dd", { class: "probe" }, probeText(explained, rule))),
      h("details", {}, h("summary", {}, "Request body and audit trail"),
        json(r.body ?? r),
        h("ol", { class: "trail-list" }, e.events.map((ev) =>
          h("li", {}, `${when(ev.at)} ${ev.event} by ${ev.attempt_id} (gen ${ev.generation})${ev.detail ? ` — ${ev.detail}` : ""}`)))),
      this.form(e, id));
  }

  form(e, id) {
    const outcome = (value) => h("label", { class: "radio" },
      h("input", { type: "radio", name: `${id}-outcome`, value, checked: value === "completed" }), value);
    const status = h("input", { id: `${id}-status`, type: "number", min: 100, max: 599, value: 200, required: true });
    const body = h("textarea", { id: `${id}-body`, rows: 3, placeholder: '{"id": 1}' });
    const note = h("textarea", { id: `${id}-note`, rows: 2, required: true, maxlength: 4096,
      placeholder: "What you found in the outside world" });
    const by = h("input", { id: `${id}-by`, required: true, maxlength: 256, value: localStorage.getItem(BY) || "",
      placeholder: "you@example.com", autocomplete: "username" });
    const consequence = h("p", { class: "consequence", id: `${id}-consequence` });
    const evidence = h("fieldset", { class: "evidence" },
      h("legend", {}, "The answer later attempts get"),
      h("label", { for: `${id}-status` }, "Status"), status,
      h("label", { for: `${id}-body` }, "Body (JSON, or text)"), body);
    const result = h("div", { role: "status", "aria-live": "polite" });
    const confirm = h("div", { class: "confirm", hidden: true });
    const chosen = () => form.querySelector(`input[name="${id}-outcome"]:checked`).value;
    const update = () => {
      const value = chosen();
      evidence.hidden = value !== "completed";
      status.required = value === "completed";
      consequence.textContent = `${value}: ${CONSEQUENCE[value]}`;
    };
    const form = h("form", {
      class: "resolve", "aria-label": `Resolve ${e.key}`,
      onfocusin: () => this.open.add(id),
      onchange: update,
      onsubmit: (event) => {
        event.preventDefault();
        const value = chosen();
        replace(confirm,
          h("p", {}, `Resolve ${e.key} of task ${e.task} as ${value}? ${CONSEQUENCE[value]}`),
          h("button", { type: "button", class: "primary", onclick: () => this.resolve(e, form, value, { status, body, note, by }, result, confirm) }, "Confirm"),
          h("button", { type: "button", onclick: () => { confirm.hidden = true; } }, "Cancel"));
        confirm.hidden = false;
        confirm.querySelector("button").focus();
      },
    },
    h("fieldset", {}, h("legend", {}, "Resolve as"), ["completed", "failed", "abandoned"].map(outcome)),
    consequence, evidence,
    h("label", { for: `${id}-note` }, "Note (why)"), note,
    h("label", { for: `${id}-by` }, "Resolved by"), by,
    h("button", { type: "submit" }, "Resolve…"), confirm, result);
    update();
    return form;
  }

  async resolve(e, form, outcome, fields, result, confirm) {
    confirm.hidden = true;
    replace(result);  // a refusal from an earlier try must not read as this try's answer
    const asked = { outcome, note: fields.note.value.trim(), by: fields.by.value.trim() };
    if (outcome === "completed") {
      const text = fields.body.value.trim();
      let body = null;
      if (text) {
        try { body = JSON.parse(text); } catch { body = text; }
      }
      asked.response = { status: Number(fields.status.value), body };
    }
    localStorage.setItem(BY, asked.by);
    const path = `/v1/tasks/${encodeURIComponent(e.task)}/effects/${encodeURIComponent(e.key)}/resolve`;
    try {
      const done = await post(path, asked);
      replace(result, h("p", { class: "ok-note" },
        `Resolved as ${done.outcome} by ${done.by}; the effect is now ${done.state}.`));
      for (const input of form.querySelectorAll("input, textarea, button")) input.disabled = true;
      this.open.clear();
    } catch (error) {
      replace(result, errorBox(error));
    }
  }
}
