-- When each API key last sent a request (issue 23: the console shows keys with their last use). Numbered 0015
-- by the lead.
--
-- Kept on the key, not derived from usage rows on every read: usage rows are pruned after their retention, and
-- a key last used before that would read as never used. The usage writer raises it with each batch it writes.
-- NULL: no request with this key was ever recorded (the backfill below takes what the kept rows know).
ALTER TABLE api_keys ADD COLUMN last_used_at DOUBLE PRECISION;
UPDATE api_keys SET last_used_at = (SELECT MAX(usage.time) FROM usage WHERE usage.key_id = api_keys.id);
