"""``sidecar resume TASK``: the seed's eight-step resume checklist, performed now.

* :mod:`.model` - the report: each step with its status and evidence, each effect with
  what a probe found and what the next attempt will do, the verdict and its exit code;
* :mod:`.judge` - pure decisions: the lease, what the next attempt does with each effect,
  the verdict (no I/O, unit-tested);
* :mod:`.probing` - asks the outside world about one logged effect *now*, through the
  proxy's own codecs (the rule's probe, git's advertised refs);
* :mod:`.checklist` - runs the eight steps against a store, the same in the CLI
  (``--data-dir``/``--store``) and inside a running sidecar (``--control``).

Resume is a check an operator runs before restarting an agent: it never claims the
task and writes nothing but the store's own test write (see :mod:`.checklist`).
"""
