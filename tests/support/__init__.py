"""What the tests need besides pytest: real processes and worlds to run them in.

Test agents and upstreams, a GitHub world, PostgreSQL worlds and a private TLS cluster,
several sidecar nodes on one store, store outages (full disk, lost server), network
namespaces, a Kubernetes API emulator, certificates, servers stopped without leaking
sockets. Nothing here ships: ``sidecar.testing`` keeps only what shipped commands use.
"""
