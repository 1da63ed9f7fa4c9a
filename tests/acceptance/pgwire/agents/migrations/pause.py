"""Lets a test catch the migration tool part-way: MIGRATION_PAUSE_IN=<revision> makes
that revision announce itself on stdout, after its statements, and wait to be killed."""

import os
import sys
import time


def maybe(revision: str) -> None:
    if os.environ.get("MIGRATION_PAUSE_IN") == revision:
        print(f"paused in {revision}", flush=True)
        sys.stdout.flush()
        time.sleep(120)
