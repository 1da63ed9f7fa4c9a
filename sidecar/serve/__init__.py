"""``sidecar serve``: the process, assembled.

* :mod:`.server` - store and rules first, then the proxy, the PostgreSQL relay (when
  configured), the control API, and ``--task``'s own lease;
* :mod:`.readiness` - what ``/readyz`` and the proxy gate wait for;
* :mod:`.notify` - telling operators (webhooks) what waits for them.
"""
