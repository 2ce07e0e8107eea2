-- Issue 14: retention (sql/020_ledger.sql, sql/160_retention.sql): the registry of tables that
-- age by month, and the signed record of what retention drops (retention_summaries is chained).
-- The owner creates month partitions (only while partition maintenance runs: refuse_owner_ddl).
GRANT CREATE ON SCHEMA querylayer TO querylayer_owner;
CREATE TABLE querylayer.aging_tables (
    table_name  text PRIMARY KEY,
    time_column text NOT NULL,
    primary_key text[] NOT NULL,
    indexes     text[] NOT NULL DEFAULT '{}'
);

CREATE TABLE querylayer.retention_drops (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    table_name     text NOT NULL,
    partition_name text NOT NULL,
    range_from     timestamptz,
    range_to       timestamptz,
    rows           bigint NOT NULL,
    bytes          bigint NOT NULL,
    statement      jsonb NOT NULL,
    signature      text NOT NULL,
    server_key_id  uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    dropped_by     text NOT NULL,
    dropped_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.make_append_only('querylayer.retention_drops'::regclass);

CREATE TABLE querylayer.retention_summaries (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    drop_id        uuid NOT NULL REFERENCES querylayer.retention_drops ON DELETE RESTRICT,
    statement      jsonb NOT NULL,
    signature      text NOT NULL,
    server_key_id  uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.retention_summaries'::regclass);
SELECT querylayer.make_chained('querylayer.retention_summaries'::regclass);
ALTER TABLE querylayer.aging_tables OWNER TO querylayer_owner;
ALTER TABLE querylayer.retention_drops OWNER TO querylayer_owner;
ALTER TABLE querylayer.retention_summaries OWNER TO querylayer_owner;
