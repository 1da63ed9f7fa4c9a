-- 0004: how each attempt's agent ended, as its worker (`sidecar exec`) reported it when it
-- released the lease: an exit status or the signal that killed it, why the command could
-- not be started (exit 127/126), or that the worker stopped it because its lease was lost.
ALTER TABLE attempts ADD COLUMN exit_code INTEGER CHECK (exit_code BETWEEN 0 AND 255);
ALTER TABLE attempts ADD COLUMN exit_signal TEXT;
ALTER TABLE attempts ADD COLUMN exit_error TEXT;
ALTER TABLE attempts ADD COLUMN lease_lost BOOLEAN NOT NULL DEFAULT FALSE;
