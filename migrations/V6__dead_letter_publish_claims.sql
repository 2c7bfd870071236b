-- The dead-letter relay holds no transaction while it waits for the broker: it claims a batch
-- of letters in a short transaction, publishes them outside any, then records each outcome in
-- another short one. A claim lasts until `publish_claimed_until` (a relay that died mid-round
-- leaves its letters to be claimed again then); a letter whose publish failed is set aside
-- until `publish_next_at` (its own backoff, growing with `publish_attempts`), so that it never
-- holds back the others. `publish_error` keeps its last reason.
ALTER TABLE dead_letters ADD COLUMN publish_claimed_until timestamptz;
ALTER TABLE dead_letters ADD COLUMN publish_next_at timestamptz;
