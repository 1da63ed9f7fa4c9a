"""Stand-ins for the outside world an agent writes to, run as real local servers.

Each emulator speaks the real service's protocol closely enough that unmodified clients
(the ``git`` CLI, PyGithub, httpx, requests) work against it, and keeps its state on
disk so it survives a restart - the demo and the tests kill processes, not the world.
"""
