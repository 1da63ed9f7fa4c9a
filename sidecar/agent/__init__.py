"""``sidecar exec``: one attempt of a task around an unmodified agent command.

* :mod:`.worker` - the attempt: claim, the agent's environment, run it (isolated where
  possible), heartbeat, release with how it ended;
* :mod:`.leasekeeper` - claim / heartbeat / release, against a store or a control API
  (``serve --task`` holds its lease with it too);
* :mod:`.trust` - the variables that make clients trust the sidecar's CA;
* :mod:`.isolation` - the network namespace whose only way out is the sidecar.
"""
