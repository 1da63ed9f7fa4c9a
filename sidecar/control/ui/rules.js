// The loaded rules (GET /v1/rules) and "what would this request be?" (POST
// /v1/rules/explain, as `sidecar rules explain`).

import { get, post } from "./api.js";
import { errorBox, h, json, replace, short, table } from "./dom.js";

function matchText(rule) {
  const m = rule.definition.match || {};
  if (m.sql) return `SQL ${JSON.stringify(m.sql)}`;
  return [m.method ? m.method.join("|") : "any", (m.host || []).join(","), m.path || "/*"].join(" ");
}

function explained(found) {
  const rows = [];
  const add = (name, value) => rows.push(h("dt", {}, name), h("dd", { class: "mono" }, value));
  const one = (x) => {
    add("rule", x.rule ? `${x.rule.name} (${x.rule.at}), effect ${x.rule.effect}` : "none");
    add("disposition", x.disposition);
    for (const shadowed of x.shadows || []) add("shadows", `${shadowed.name} (${shadowed.at})`);
    if (x.effect_key) add("effect key", x.effect_key);
    if (x.key_from) add("key from", x.key_from);
    if (x.idempotency !== undefined) add("idempotency", x.idempotency ? `${x.idempotency.header}: ${x.idempotency.value}` : "none sent");
    if (x.on_unknown) add("on unknown", `${x.on_unknown}; on divergence ${x.on_divergence}`);
    if (x.probe !== undefined) {
      const p = x.probe;
      add("probe", !p ? "none" : p.builtin || p.error || `${p.method} ${p.host}${p.path}, found if ${p.found}`);
    }
    if (x.uncovered) add("a rule to start from", JSON.stringify(x.uncovered.suggested_match));
  };
  if (found.http) one(found.http);
  else for (const st of found.sql.statements) { add("statement", st.statement); one(st); }
  return [h("dl", { class: "facts", id: "explained" }, rows), h("details", {}, h("summary", {}, "As JSON"), json(found))];
}

export class RulesView {
  constructor(main) {
    this.main = main;
  }

  async show() {
    this.list = h("div");
    const method = h("select", { id: "x-method" }, ["POST", "PUT", "PATCH", "DELETE", "GET"].map((m) => h("option", {}, m)));
    const url = h("input", { id: "x-url", type: "url", placeholder: "https://api.github.com/repos/acme/app/pulls", size: 60 });
    const body = h("textarea", { id: "x-body", rows: 3, placeholder: '{"head": "agent/312", "base": "main"}' });
    const sql = h("textarea", { id: "x-sql", rows: 2, placeholder: "or SQL: ALTER TABLE users ADD COLUMN age int" });
    const out = h("div", { "aria-live": "polite" });
    const form = h("form", { class: "explain", onsubmit: async (event) => {
      event.preventDefault();
      const asked = {};
      if (sql.value.trim()) asked.sql = sql.value.trim();
      else {
        asked.method = method.value;
        asked.url = url.value.trim();
        const text = body.value.trim();
        if (text) { try { asked.body = JSON.parse(text); } catch { asked.body = text; } }
      }
      try { replace(out, explained(await post("/v1/rules/explain", asked))); } catch (error) { replace(out, errorBox(error)); }
    } },
    h("label", { for: "x-method" }, "Method"), method,
    h("label", { for: "x-url" }, "URL"), url,
    h("label", { for: "x-body" }, "Body (JSON)"), body,
    h("label", { for: "x-sql" }, "SQL instead"), sql,
    h("button", { type: "submit" }, "Explain"));
    replace(this.main, h("h1", {}, "Rules"),
      h("h2", {}, "What would this request be?"), form, out,
      h("h2", {}, "Loaded rules, in matching order"), this.list);
    try {
      const listed = await get("/v1/rules");
      replace(this.list, listed.rules.length ? table(["#", "Rule", "Effect", "Match", "Key", "On unknown", "Where"],
        listed.rules.map((r, i) => h("tr", {},
          h("td", { class: "num" }, i + 1),
          h("th", { scope: "row" }, h("details", {}, h("summary", {}, r.name), json(r.definition))),
          h("td", {}, r.effect), h("td", { class: "mono" }, short(matchText(r), 70)),
          h("td", { class: "mono" }, short(r.definition.key || "", 50)),
          h("td", {}, r.on_unknown + (r.probe ? " (probe)" : "")),
          h("td", { class: "mono" }, short(r.at.split("/").slice(-1)[0], 40))))) :
        h("p", { class: "muted" }, "No rule loaded: every request passes through."));
    } catch (error) {
      replace(this.list, errorBox(error));
    }
  }

  async refresh() {}
}
