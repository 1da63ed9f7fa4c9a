"""``sidecar exec --isolate``: the agent in a network namespace whose only way out is the sidecar.

* :mod:`.rules` - the namespace's iptables rules (pure text): 80/443 to the transparent
  HTTP listener, PostgreSQL ports to the relay's, every other TCP refused;
* :mod:`.resolv` - the namespace's ``/etc/hosts`` and ``/etc/resolv.conf`` (routed names
  get addresses of their own, DNS goes to a relay on the namespace's loopback);
* :mod:`.netns` - creating the namespace and its listening sockets, and the argv that
  starts the agent inside it; whether this machine can do it at all;
* :mod:`.forward` - exec's side of those sockets: byte pipes to the sidecar's loopback
  ports, transparent connections turned into ``CONNECT`` with the attempt's credentials,
  the DNS relay;
* :mod:`.jks` - a Java trust store (for the language knobs, isolated or not).
"""
