"""What shipped commands and the README walkthrough run besides the product itself.

:mod:`.processes` starts real processes and kills them with real signals (``sidecar
demo``, ``sidecar matrix``); :mod:`.sidecar` is one ``sidecar serve`` process (started,
killed, restarted on the same data and ports) and the agents it runs under ``sidecar
exec``, which every world composes; :mod:`.github` is the demo's world (the GitHub
emulator, the model, the sidecar); :mod:`.upstream` is the counting upstream the README
walkthrough and the benchmarks stand in for a real API with, served by :mod:`.served`.
Test worlds live in ``tests/support``.
"""
