"""The control API: claim leases, checkpoints and the audit trail over JSON/HTTP."""

from sidecar.control.app import make_app

__all__ = ["make_app"]
