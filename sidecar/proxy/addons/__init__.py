"""mitmproxy addons, one concern each, assembled in order by :func:`sidecar_addons`.

Order matters: the gate answers first; the binder strips and reads the sidecar's own
headers; the effect addon matches rules against the host the agent asked for; the router
then sends what is passed through to its real destination.
"""

from sidecar.proxy.addons.binder import TaskBinder
from sidecar.proxy.addons.effects import EffectAddon
from sidecar.proxy.addons.gate import ReadinessGate
from sidecar.proxy.addons.router import Router

__all__ = ["EffectAddon", "ReadinessGate", "Router", "TaskBinder"]
