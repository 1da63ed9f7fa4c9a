"""``sidecar review``: the monthly review of what the sidecar saw and did (SPEC §6).

One concern per module:

* :mod:`.figures` - the figures, as pydantic models: what ``--json``, the control route
  ``GET /v1/review`` and both reports carry;
* :mod:`.tally` - pure arithmetic: percentiles, stage durations against the lease, the
  counting of audit lines; no I/O, unit-tested alone;
* :mod:`.collect` - reading a store's window a page at a time into the figures;
* :mod:`.proof` - the active part: a stale write attempted on a scratch task (it must be
  refused) and the review's own timed writes, against a store or a control API;
* :mod:`.charts` - the report's SVG charts (pygal, no JavaScript, no network);
* :mod:`.report_html`, :mod:`.report_text` - the figures as one self-contained HTML file,
  and as text for the terminal.
"""

from __future__ import annotations

#: Scratch tasks of the fencing proof are named with this prefix plus random hex; the
#: review leaves them out of its figures and the control API deletes only these.
SCRATCH_PREFIX = "sidecar-review-fence-"

__all__ = ["SCRATCH_PREFIX"]
