"""Helpers shared by the tests, ``sidecar demo``, ``matrix`` and ``review``.

Real processes, real signals: :mod:`.processes` starts and kills them,
:mod:`.checkpoint_writer` is a worker that writes checkpoints until it is killed.
"""
