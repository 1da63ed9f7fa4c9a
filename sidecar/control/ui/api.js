// Calls to the control API's JSON routes, with the bearer token the operator typed in.
//
// The token lives in sessionStorage (this tab only) and goes in the Authorization header,
// never in a URL. A 401 shows the token form; the call is retried once a token is given.

const KEY = "effect-sidecar.token";

export class Problem extends Error {
  // An RFC 9457 answer: `code` is the stable member, `detail` is for humans.
  constructor(status, body) {
    super(body?.detail || body?.title || `HTTP ${status}`);
    this.status = status;
    this.code = body?.code || "http_error";
    this.body = body;
  }
}

let waiting = null; // the promise of a token while the form is shown

function askForToken(why) {
  if (waiting) return waiting;
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  document.getElementById("token-why").textContent = why;
  form.hidden = false;
  input.value = "";
  input.focus();
  waiting = new Promise((resolve) => {
    form.onsubmit = (event) => {
      event.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      sessionStorage.setItem(KEY, token);
      form.hidden = true;
      waiting = null;
      resolve(token);
    };
  });
  return waiting;
}

async function call(method, path, body, accept = "application/json") {
  for (;;) {
    const headers = { Accept: `${accept}, application/problem+json` };
    const token = sessionStorage.getItem(KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
    if (response.status === 401) {
      const current = sessionStorage.getItem(KEY);
      if (current && current !== token) continue; // a newer token was given meanwhile
      sessionStorage.removeItem(KEY);
      await askForToken(
        token ? "That token was refused. Enter the control token again." :
          "This sidecar's control API needs its bearer token.",
      );
      continue;
    }
    if (!response.ok) {
      let problem = null;
      try { problem = await response.json(); } catch { /* not JSON */ }
      throw new Problem(response.status, problem);
    }
    return accept === "application/json" ? response.json() : response.text();
  }
}

export const get = (path) => call("GET", path);
export const getText = (path, accept) => call("GET", path, undefined, accept);
export const post = (path, body) => call("POST", path, body);

export function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(name, value);
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}
