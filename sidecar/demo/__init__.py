"""``sidecar demo``: the seed's worked scenario (task #312), with real processes.

model.py     a local model endpoint whose patches differ on every call
agent.py     an unmodified coding agent: model, git, PyGithub; nothing of the sidecar
scenario.py  runs it under the sidecar (killed after its push, restarted) and without
"""
