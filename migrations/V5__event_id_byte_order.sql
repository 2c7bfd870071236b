-- Event ids are opaque keys: their order is the order of their bytes ("C"), not the database's
-- language rules. With the database's collation every comparison in the two primary-key indexes
-- and in the sort of each batch went through the locale's strcoll (an eighth of PostgreSQL's
-- time in the write path). Equality, and so uniqueness, is the same under either rule. Both
-- columns change together, in this migration's transaction, so the foreign key keeps comparing
-- like with like; PostgreSQL rebuilds the two indexes (not the tables).
ALTER TABLE inbox ALTER COLUMN event_id TYPE text COLLATE "C";
ALTER TABLE history_events ALTER COLUMN event_id TYPE text COLLATE "C";
