"""mitmproxy addons, one concern each, assembled in order by :func:`sidecar_addons`.

Order matters: the gate answers first; the binder strips and reads the sidecar's own
headers; the effect addon matches rules against the host the agent asked for; the uncovered-writes
addon logs, records or refuses the writes no rule matched; the router
then sends what is passed through to its real destination.
"""

from sidecar.proxy.addons.binder import TaskBinder
from sidecar.proxy.addons.effects import EffectAddon
from sidecar.proxy.addons.gate import ReadinessGate
from sidecar.proxy.addons.router import Router
from sidecar.proxy.addons.uncovered import TunnelCounter, UncoveredMode, UncoveredWrites

__all__ = [
    "EffectAddon",
    "ReadinessGate",
    "Router",
    "TaskBinder",
    "TunnelCounter",
    "UncoveredMode",
    "UncoveredWrites",
]
