-- Issue 14: envelope_receipts becomes partitioned by month (sql/095_envelopes.sql), every row
-- kept; the same steps as for audit_events.
LOCK TABLE querylayer.envelope_receipts IN ACCESS EXCLUSIVE MODE;
ALTER TABLE querylayer.envelope_receipts RENAME TO envelope_receipts_0_1_0;
ALTER INDEX querylayer.envelope_receipts_pkey RENAME TO envelope_receipts_0_1_0_pkey;
ALTER TABLE querylayer.envelope_receipts_0_1_0 RENAME CONSTRAINT envelope_receipts_site_id_fkey TO envelope_receipts_0_1_0_site_id_fkey;

CREATE SEQUENCE querylayer.envelope_receipt_ids AS bigint;
CREATE TABLE querylayer.envelope_receipts (
    id            bigint NOT NULL DEFAULT nextval('querylayer.envelope_receipt_ids'),
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    site_id       uuid REFERENCES querylayer.sites ON DELETE RESTRICT,
    connection_id uuid,
    allowed       boolean NOT NULL,
    path          text NOT NULL,
    method        text NOT NULL,
    profile       text,
    sender        text,
    error         text,
    checks        jsonb
) PARTITION BY RANGE (at);
ALTER SEQUENCE querylayer.envelope_receipt_ids OWNED BY querylayer.envelope_receipts.id;
ALTER TABLE querylayer.envelope_receipts ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.envelope_receipts FORCE ROW LEVEL SECURITY;
CREATE POLICY receipts_read ON querylayer.envelope_receipts FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY receipts_write ON querylayer.envelope_receipts FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.envelope_receipts'::regclass);
-- Each partition has the key (id, at).
SELECT querylayer.age_by_month('querylayer.envelope_receipts'::regclass, 'at'::name, ARRAY['id', 'at']::text[]);
SELECT querylayer.create_time_partition('querylayer.envelope_receipts'::text, extract(year FROM m)::integer, extract(month FROM m)::integer)
  FROM (SELECT DISTINCT date_trunc('month', at AT TIME ZONE 'UTC') AS m FROM querylayer.envelope_receipts_0_1_0) months;
INSERT INTO querylayer.envelope_receipts (id, at, site_id, connection_id, allowed, path, method, profile, sender, error, checks)
SELECT id, at, site_id, connection_id, allowed, path, method, profile, sender, error, checks
  FROM querylayer.envelope_receipts_0_1_0 ORDER BY id;
SELECT setval('querylayer.envelope_receipt_ids', coalesce((SELECT max(id) FROM querylayer.envelope_receipts_0_1_0), 0) + 1, false);
DROP TABLE querylayer.envelope_receipts_0_1_0;
ALTER TABLE querylayer.envelope_receipts OWNER TO querylayer_owner;
