-- Issue 16 (goal 3): the holder of a site's head reads its pending queue from where it can still
-- hold anything (sql/020_ledger.sql, docs/ledger.md "Where the queue begins"). Entries already
-- pending take the number of this transaction, and no head has a beginning yet, so the first
-- sealer of each site reads its whole queue, as before.
ALTER TABLE querylayer.ledger_heads
    ADD COLUMN pending_from    bigint,
    ADD COLUMN pending_cluster bigint;
ALTER TABLE querylayer.ledger_pending
    ADD COLUMN xact bigint NOT NULL DEFAULT CAST(CAST(pg_catalog.pg_current_xact_id() AS pg_catalog.text) AS pg_catalog.int8);
CREATE INDEX ledger_pending_xact ON querylayer.ledger_pending (site_id, xact);
-- The order of writing is no longer a key: the record is (the seal deletes by it).
ALTER TABLE querylayer.ledger_pending
    DROP CONSTRAINT ledger_pending_pkey,
    DROP CONSTRAINT ledger_pending_record_id_key,
    ADD PRIMARY KEY (record_id);
