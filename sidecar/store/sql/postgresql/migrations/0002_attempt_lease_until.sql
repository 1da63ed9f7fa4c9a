-- 0002: remember, for each ended attempt, the last moment its lease let it act, so that
-- a later attempt knows when the old one can no longer land a request (settle time).
ALTER TABLE attempts ADD COLUMN lease_until BIGINT;
