-- Issue 14: audit_events becomes partitioned by month (sql/050_audit.sql), every row kept.
-- The 0.1.0 table steps aside under another name, the 0.2.0 table takes its name with the same
-- columns, row-level security, policies and append-only triggers, a partition for every month
-- its rows cover (and the months ahead), the rows move with their ids, and the old table goes.
LOCK TABLE querylayer.audit_events IN ACCESS EXCLUSIVE MODE;
ALTER TABLE querylayer.audit_events RENAME TO audit_events_0_1_0;
ALTER INDEX querylayer.audit_events_pkey RENAME TO audit_events_0_1_0_pkey;
ALTER INDEX querylayer.audit_events_site_at RENAME TO audit_events_0_1_0_site_at;
-- Its constraints too, so that the new table's get the names a fresh install gives them.
ALTER TABLE querylayer.audit_events_0_1_0 RENAME CONSTRAINT audit_events_principal_kind_check TO audit_events_0_1_0_principal_kind_check;
ALTER TABLE querylayer.audit_events_0_1_0 RENAME CONSTRAINT audit_events_site_id_fkey TO audit_events_0_1_0_site_id_fkey;

CREATE SEQUENCE querylayer.audit_event_ids AS bigint;
CREATE TABLE querylayer.audit_events (
    id              bigint NOT NULL DEFAULT nextval('querylayer.audit_event_ids'),
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    site_id         uuid REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid,
    principal_kind  text NOT NULL CHECK (principal_kind IN ('connection', 'member', 'operator', 'anonymous')),
    agent_id        uuid,
    connection_id   uuid,
    member_id       uuid,
    operator_role   text,
    action          text NOT NULL,
    outcome         text NOT NULL DEFAULT 'ok',
    target          text,
    detail          jsonb NOT NULL DEFAULT '{}'
) PARTITION BY RANGE (at);
ALTER SEQUENCE querylayer.audit_event_ids OWNED BY querylayer.audit_events.id;
ALTER TABLE querylayer.audit_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.audit_events FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_read ON querylayer.audit_events FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY audit_write ON querylayer.audit_events FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.audit_events'::regclass);
-- Each partition has the key (id, at) and an index on (site_id, at).
SELECT querylayer.age_by_month('querylayer.audit_events'::regclass, 'at'::name, ARRAY['id', 'at']::text[],
                               ARRAY['site_id, at']::text[]);
SELECT querylayer.create_time_partition('querylayer.audit_events'::text, extract(year FROM m)::integer, extract(month FROM m)::integer)
  FROM (SELECT DISTINCT date_trunc('month', at AT TIME ZONE 'UTC') AS m FROM querylayer.audit_events_0_1_0) months;
INSERT INTO querylayer.audit_events (id, at, site_id, organization_id, principal_kind, agent_id, connection_id,
                                     member_id, operator_role, action, outcome, target, detail)
SELECT id, at, site_id, organization_id, principal_kind, agent_id, connection_id,
       member_id, operator_role, action, outcome, target, detail
  FROM querylayer.audit_events_0_1_0 ORDER BY id;
SELECT setval('querylayer.audit_event_ids', coalesce((SELECT max(id) FROM querylayer.audit_events_0_1_0), 0) + 1, false);
DROP TABLE querylayer.audit_events_0_1_0;
ALTER TABLE querylayer.audit_events OWNER TO querylayer_owner;
