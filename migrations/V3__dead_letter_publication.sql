-- When the dead letter was published to the configured dead-letter topic, if it was: a
-- redelivered poison record is then not published a second time.
ALTER TABLE dead_letters ADD COLUMN published_at timestamptz;
