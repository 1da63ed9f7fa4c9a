"""``sidecar matrix``: the seed's failure-injection matrix, filled for the user's own agent.

* :mod:`.faults` - the faults and the seed rows they stand for;
* :mod:`.plan`   - a clean run's effects x the faults = the cells, each armed by ordinal;
* :mod:`.stack`  - a cell's private sidecar and the agent's attempts against it;
* :mod:`.cell`   - injecting one fault, resuming, and judging the cell;
* :mod:`.report` - ``matrix.md`` (the seed's table) and ``matrix.json``;
* :mod:`.run`    - discovery, cells in parallel, progress.
"""
