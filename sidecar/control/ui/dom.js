// Building DOM without innerHTML (every value from the store is text), and formatting.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  append(node, children);
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
}

export function table(headers, rows, caption) {
  return h("table", {},
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows));
}

export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// Times: the page shows UTC (what logs and the CLI print), with a relative hint.
export function when(iso) {
  if (!iso) return "—";
  return iso.replace("T", " ").replace(/\.\d+/, "").replace(/\+00:00$|Z$/, "Z");
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "";
  return `${span((now - Date.parse(iso)) / 1000)} ago`;
}

export function span(seconds) {
  const sign = seconds < 0 ? "-" : "";
  let left = Math.abs(seconds);
  if (left < 60) return `${sign}${left.toFixed(left < 10 ? 1 : 0)} s`;
  left /= 60;
  if (left < 60) return `${sign}${Math.floor(left)} min ${Math.round((left % 1) * 60)} s`;
  left /= 60;
  if (left < 48) return `${sign}${Math.floor(left)} h ${Math.round((left % 1) * 60)} min`;
  return `${sign}${Math.floor(left / 24)} d`;
}

export function time(iso) {
  return h("time", { datetime: iso, title: ago(iso) }, when(iso));
}

export function pill(state) {
  return h("span", { class: `pill st-${state}` }, state);
}

export function short(text, length = 48) {
  if (!text) return "";
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}

export function errorBox(error) {
  const code = error.code ? ` (${error.code})` : "";
  return h("p", { class: "error", role: "alert" }, `${error.message}${code}`);
}

export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}
