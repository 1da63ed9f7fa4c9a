"""What ``sidecar serve`` must have in place before ``/readyz`` says ready.

The store's durable test write is checked on every ``/readyz`` call by the route itself;
this module owns the other conditions, which the server declares at start-up and marks
met as each part comes up: the proxy's gate is open (it answers requests instead of
``503 not_ready``), the PostgreSQL relay listens, the sidecar's own ``--task`` lease is
held. Kubernetes holds an injected agent back until the sidecar's startupProbe passes,
so "ready" must mean "an agent started now is fully covered", not "the control API
answers". A condition can be lost again (the lease, when another worker fences this
one); ``/readyz`` then turns 503 and says why.
"""

from __future__ import annotations

from sidecar.errors import NotReady


class Readiness:
    """Named conditions, each pending (with the reason shown) until marked met."""

    def __init__(self) -> None:
        self._pending: dict[str, str] = {}

    def require(self, name: str, waiting_for: str) -> None:
        """Declare (or re-open, when lost) a condition; ``waiting_for`` says what is missing."""
        self._pending[name] = waiting_for

    def met(self, name: str) -> None:
        self._pending.pop(name, None)

    def pending(self) -> dict[str, str]:
        return dict(self._pending)

    def check(self) -> None:
        """Raise :class:`NotReady` naming every condition still pending."""
        if self._pending:
            raise NotReady(self.pending())
