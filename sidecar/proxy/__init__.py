"""HTTP(S) interception: mitmproxy embedded in the sidecar, and the effect flow it feeds.

embed.py     builds and runs mitmproxy's Master inside the sidecar's event loop
addons/      one mitmproxy addon per concern (gate, task binding, effects, routing)
guard.py     the effect flow of SPEC §3, free of mitmproxy types
upstream.py  the sidecar's own HTTP client: forwards recorded effects, runs probes
bindings.py  which task/attempt/generation a request acts for; self-fencing
routes.py    --route HOST=URL
redact.py    what of a request may be written to the effect log
ca.py        the interception CA and the combined trust bundle handed to agents
"""
