"""HTTP(S) interception: mitmproxy embedded in the sidecar, and the effect flow it feeds.

embed.py     builds and runs mitmproxy's Master inside the sidecar's event loop, with
             only the mitmproxy addons a sidecar needs
addons/      one mitmproxy addon per concern (gate, task binding, effects, routing)
guard.py     the effect flow of SPEC §3, free of mitmproxy types
codecs.py    per protocol (HTTP, git push): key, fingerprint, outcome, replay, probe
upstream.py  the sidecar's own HTTP client: forwards recorded effects, runs probes
routes.py    --route HOST=URL
redact.py    what of a request may be written to the effect log
ca.py        the interception CA and the combined trust bundle handed to agents

Importing this package registers ``mitmproxy.addons`` without running its
``__init__``, which imports every default addon - the onboarding app (Flask, Jinja),
proxy authentication (ldap3), playback, HAR export: about 0.2 s of start-up and 13 MiB
of memory for features a sidecar never loads.  ``from mitmproxy.addons import core``
then loads just ``core``.  If the package was imported already (another program in the
same process), nothing changes.
"""

import importlib.util
import sys


def _addons_package_alone() -> None:
    if "mitmproxy.addons" in sys.modules:
        return
    spec = importlib.util.find_spec("mitmproxy.addons")
    if spec is None:
        return  # no mitmproxy: the import that needs it says so
    package = importlib.util.module_from_spec(spec)
    sys.modules["mitmproxy.addons"] = package
    sys.modules["mitmproxy"].__dict__["addons"] = package  # as the import system binds it


_addons_package_alone()
