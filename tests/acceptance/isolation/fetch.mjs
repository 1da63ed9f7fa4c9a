// Node's fetch (undici) and https module: neither reads HTTP(S)_PROXY on Node 20.
import https from "node:https";
const [kind, name] = process.argv.slice(2);
const url = "https://api.things.test/repos/iso/lab/things";
const body = JSON.stringify({ name });
if (kind === "fetch") {
  try {
    const r = await fetch(url, { method: "POST", body, headers: { "content-type": "application/json" } });
    console.log(`node-fetch ${r.status} ${r.headers.get("x-sidecar-effect")}`);
  } catch (e) {
    console.log(`node-fetch error ${e.cause?.code ?? e.message}`);
  }
} else {
  const req = https.request(url, { method: "POST", headers: { "content-type": "application/json" } }, (r) => {
    r.resume();
    console.log(`node-https ${r.statusCode} ${r.headers["x-sidecar-effect"]}`);
  });
  req.on("error", (e) => console.log(`node-https error ${e.code}`));
  req.end(body);
}
