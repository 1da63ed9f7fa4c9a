"""The PostgreSQL relay: agents' SQL carried to the real server, the statements a rule
matches run exactly once.

Its modules, in the order a connection meets them:

* :mod:`.serving` - the relay as ``sidecar serve`` assembles it (imported only with
  ``--pg-upstream``), and the address ``sidecar exec`` is told;
* :mod:`.relay` - accepts the connection, passes start-up through (SSLRequest, binding to
  an attempt, CancelRequest, transparent mode) and hands the rest to a session;
* :mod:`.tls` - the certificate the agent's TLS handshake gets, from the sidecar's CA;
* :mod:`.codec` - the v3 wire protocol, sans-io: byte streams cut into messages that
  keep their exact bytes;
* :mod:`.messages` - decoding the messages the sidecar acts on, building the ones it
  answers with;
* :mod:`.session` - one connection after start-up: relays, tracks prepared statements
  and portals, hands a statement a rule matches to the engine;
* :mod:`.tracker` - which server message answers which request, the agent's or the
  sidecar's own;
* :mod:`.exactly_once` - the engine: a matched statement and its record in one
  transaction of the agent's database, replayed from the record when it exists;
* :mod:`.redaction` - password literals kept out of the recorded statement and its key;
* :mod:`.ordinals` - the n-th run of the same statement in one attempt, a key of its own;
* :mod:`.records` - the sidecar's ``effect_sidecar.effects`` table in the agent's
  database, and the requests that read and write it;
* :mod:`.mirror` - the outcome mirrored into the sidecar's effect log, where fencing,
  ``sidecar effects`` and the audit trail look.

Which statements are effects, and what their keys are, is :mod:`sidecar.rules.sql`.
"""
