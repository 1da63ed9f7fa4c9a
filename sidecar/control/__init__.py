"""The control API: claim leases, checkpoints and the audit trail over JSON/HTTP."""
