-- The audit trail: every mutation and every failed authentication. Append-only. It never holds
-- a secret, a fingerprint or a token, and no argument values of agent calls beyond identifiers.
-- It is an access log, not governed history (the chained tables are): it is partitioned by
-- month and ages out whole months through querylayer_api.apply_retention, which leaves a
-- signed summary of every month it drops in each site's chain (160_retention.sql).

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
-- Site records belong to their site; records without a site (failed authentications) are
-- written by anyone and read by operators only.
CREATE POLICY audit_read ON querylayer.audit_events FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY audit_write ON querylayer.audit_events FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.audit_events'::regclass);
-- Each partition has the key (id, at) and an index on (site_id, at).
SELECT querylayer.age_by_month('querylayer.audit_events'::regclass, 'at'::name, ARRAY['id', 'at']::text[],
                               ARRAY['site_id, at']::text[]);

-- Appends one audit record attributed to the current context.
CREATE FUNCTION querylayer.audit(p_action text, p_target text DEFAULT NULL,
                                 p_detail jsonb DEFAULT '{}', p_outcome text DEFAULT 'ok') RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO querylayer.audit_events (site_id, organization_id, principal_kind, agent_id, connection_id,
                                         member_id, operator_role, action, outcome, target, detail)
    VALUES (querylayer.ctx_site_id(), querylayer.ctx_organization_id(),
            CASE querylayer.ctx_kind() WHEN 'connection' THEN 'connection' WHEN 'member' THEN 'member'
                                       WHEN 'operator' THEN 'operator' ELSE 'anonymous' END,
            querylayer.ctx_agent_id(), querylayer.ctx_connection_id(), querylayer.ctx_member_id(),
            CASE WHEN querylayer.ctx_is_operator() THEN querylayer.outer_user() END,
            p_action, p_outcome, p_target, coalesce(p_detail, '{}'));
END
$$;

-- Called by the extension (record_failed_authentication) with no context held.
CREATE FUNCTION querylayer.audit_failed_authentication(p_detail jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO querylayer.audit_events (site_id, principal_kind, action, outcome, detail)
    VALUES (NULL, 'anonymous', 'authenticate', 'denied', p_detail);
END
$$;
