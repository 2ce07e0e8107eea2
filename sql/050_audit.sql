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
-- One audit row per MCP tool call: who (from the context), which tool, outcome, duration.
-- Never argument values. The row is written by querylayer.tool_call_row, the one writer of
-- tool.call rows (close_tool_call, finish_tool_call and the refusals come here too).
CREATE FUNCTION querylayer.tool_call_row(p_tool text, p_outcome text, p_duration_ms integer, p_error_code text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- (A name of a letter and up to 79 letters, digits and _; the length apart, since a bounded
    -- repetition in a pattern costs PostgreSQL's regex engine far more than the test itself.)
    IF p_tool IS NULL OR length(p_tool) > 80 OR p_tool !~ '^[a-z][a-z0-9_]*$' THEN
        RAISE EXCEPTION 'tool: a tool name is required' USING ERRCODE = '22023';
    END IF;
    IF p_outcome IS NULL OR p_outcome NOT IN ('ok', 'error') THEN
        RAISE EXCEPTION 'outcome must be ok or error' USING ERRCODE = '22023';
    END IF;
    IF p_error_code IS NOT NULL AND (length(p_error_code) > 64 OR p_error_code !~ '^[a-z][a-z0-9_]*$') THEN
        RAISE EXCEPTION 'error_code: a short machine code is required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.audit_events (site_id, organization_id, principal_kind, agent_id, connection_id,
                                         action, outcome, target, detail)
    VALUES (querylayer.ctx_site_id(), querylayer.ctx_organization_id(), 'connection', querylayer.ctx_agent_id(),
            querylayer.ctx_connection_id(), 'tool.call', p_outcome, p_tool,
            jsonb_build_object('tool', p_tool, 'duration_ms', greatest(p_duration_ms, 0), 'error_code', p_error_code));
END
$$;

CREATE FUNCTION querylayer_api.record_tool_call(p_tool text, p_outcome text, p_duration_ms integer,
                                                p_error_code text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection(NULL::text);
    PERFORM querylayer.tool_call_row(p_tool, p_outcome, p_duration_ms, p_error_code);
END
$$;


-- An agent's tool call is one statement, in autocommit, so the statement is the transaction
-- and the edge makes one round trip (docs/architecture.md, "The request path"):
--
--   SELECT o ? 'replay', finish_tool_call(o, <the stored answer in o, else the function's answer>, edge_ms)
--     FROM open_tool_call(fingerprint, tool, idempotency_key, request_sha256) AS o
--
-- (edge/src/db.rs, Call::tool_call_sql, writes it.)
-- open_tool_call runs first (the call reads its row): it authenticates the connection, whose
-- context lives until the statement ends, and claims the idempotency key. The function runs as
-- that connection, unless the key holds the stored answer of an earlier call. finish_tool_call
-- stores the answer under the key and writes the tool.call row. A refusal anywhere aborts the
-- statement, so nothing of the call is kept; the edge then records the refusal with
-- record_refused_tool_call. A tool of several governed calls (an answer written by the LLM)
-- makes the same three steps in one transaction.

-- Authenticates the connection for p_tool and claims p_idempotency_key. Returns the facts
-- close_tool_call needs: {"tool", "opened_at", "idempotency_key"?, "replay"?}; "replay" is the
-- stored answer when an earlier call under the key committed.
-- With p_rate (calls a second) and p_burst, the call takes a token of the connection's bucket
-- first (sql/157_rate.sql: QL429 when it has none), so that every edge started with the same rate
-- shares one limit per connection.
CREATE FUNCTION querylayer_api.open_tool_call(p_fingerprint bytea, p_tool text,
                                              p_idempotency_key text DEFAULT NULL,
                                              p_request_sha256 bytea DEFAULT NULL,
                                              p_rate double precision DEFAULT NULL,
                                              p_burst double precision DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_opened  jsonb;
    v_claimed jsonb;
BEGIN
    PERFORM querylayer_api.authenticate(p_fingerprint);
    IF p_tool IS NULL OR length(p_tool) > 80 OR p_tool !~ '^[a-z][a-z0-9_]*$' THEN
        RAISE EXCEPTION 'tool: a tool name is required' USING ERRCODE = '22023';
    END IF;
    IF p_rate IS NOT NULL THEN
        PERFORM querylayer.refuse_rate(querylayer.take_token('connection'::text, querylayer.ctx_connection_id()::text,
                                                             p_rate, p_burst), 'connection'::text);
    END IF;
    v_opened := jsonb_build_object('tool', p_tool, 'opened_at', clock_timestamp());
    IF p_idempotency_key IS NOT NULL THEN
        v_claimed := querylayer_api.claim_idempotency_key(p_idempotency_key, p_tool, p_request_sha256);
        v_opened := v_opened || jsonb_build_object('idempotency_key', p_idempotency_key);
        IF v_claimed IS NOT NULL THEN
            v_opened := v_opened || jsonb_build_object('replay', v_claimed->'response');
        END IF;
    END IF;
    RETURN v_opened;
END
$$;

-- Ends a tool call opened in this transaction: stores a new answer under the call's key and
-- writes its tool.call row (outcome ok; duration: p_edge_ms the edge spent before the database,
-- plus the time since open_tool_call). Returns the answer itself, as it came: whether it was the
-- stored one is p_opened ? 'replay'. (Wrapping it in another object would copy the whole answer
-- once more.)
CREATE FUNCTION querylayer_api.finish_tool_call(p_opened jsonb, p_value jsonb, p_edge_ms integer DEFAULT 0)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection(NULL::text);
    IF NOT p_opened ? 'replay' AND p_opened->>'idempotency_key' IS NOT NULL THEN
        PERFORM querylayer_api.store_idempotent_response(p_opened->>'idempotency_key', p_value);
    END IF;
    PERFORM querylayer.tool_call_row(p_opened->>'tool', 'ok'::text,
        greatest(coalesce(p_edge_ms, 0), 0)
        + floor(extract(epoch FROM clock_timestamp() - (p_opened->>'opened_at')::timestamptz) * 1000)::integer,
        NULL::text);
    RETURN p_value;
END
$$;

-- finish_tool_call as the edges of 0.5.0 and earlier read it: {"value": the answer, "replayed":
-- bool}.
CREATE FUNCTION querylayer_api.close_tool_call(p_opened jsonb, p_value jsonb, p_edge_ms integer DEFAULT 0)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN jsonb_build_object('value', querylayer_api.finish_tool_call(p_opened, p_value, p_edge_ms),
                              'replayed', p_opened ? 'replay');
END
$$;

-- The one audit rule for a refused tool call, in a transaction of its own after the call's
-- rolled back (or, for a refusal the edge made itself, after nothing reached the database): a
-- live connection gets a tool.call row with outcome error and the error's code; a dead
-- credential gets the failed-authentication record of p_channel instead, and no tool.call row.
-- Returns 'recorded' or 'unauthenticated'.
CREATE FUNCTION querylayer_api.record_refused_tool_call(p_fingerprint bytea, p_tool text, p_duration_ms integer,
                                                        p_error_code text, p_channel text DEFAULT 'mcp')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    BEGIN
        PERFORM querylayer_api.authenticate(p_fingerprint);
    EXCEPTION WHEN invalid_authorization_specification THEN
        PERFORM querylayer_api.record_failed_authentication(p_fingerprint, p_channel);
        RETURN 'unauthenticated';
    END;
    PERFORM querylayer_api.record_tool_call(p_tool, 'error'::text, p_duration_ms, p_error_code);
    RETURN 'recorded';
END
$$;

-- A read tool served by a hot standby (`serve --read-database-url`, docs/operations.md "Read
-- replicas"), in two statements. On the standby, in the statement of the call:
--
--   SELECT CASE WHEN open_replica_read(fingerprint, tool, floor_lsn) THEN <the call> END
--
-- open_replica_read refuses (QLR01) a standby that has not replayed the primary's WAL up to
-- p_floor_lsn (the edge's bound on staleness, and past the connection's last write), then
-- authenticates: the call runs as the connection, read-only. Then on the primary, before the
-- answer leaves the edge, record_replica_read authenticates again (a credential revoked since
-- is refused here, on the newest state), takes the connection's rate token and writes the same
-- tool.call row as a call on the primary, durably, once: the edge never repeats it, and a
-- read whose row could not be written is never answered.
CREATE FUNCTION querylayer_api.open_replica_read(p_fingerprint bytea, p_tool text, p_floor_lsn pg_lsn)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.pg_is_in_recovery()
       AND (p_floor_lsn IS NULL OR coalesce(pg_catalog.pg_last_wal_replay_lsn(), '0/0'::pg_lsn) < p_floor_lsn) THEN
        RAISE EXCEPTION 'this standby has replayed the primary''s history only to %, not yet to %',
            pg_catalog.pg_last_wal_replay_lsn(), p_floor_lsn
            USING ERRCODE = 'QLR01', HINT = 'read from the primary, or wait for the standby';
    END IF;
    PERFORM querylayer_api.authenticate(p_fingerprint);
    IF p_tool IS NULL OR length(p_tool) > 80 OR p_tool !~ '^[a-z][a-z0-9_]*$' THEN
        RAISE EXCEPTION 'tool: a tool name is required' USING ERRCODE = '22023';
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION querylayer_api.record_replica_read(p_fingerprint bytea, p_tool text, p_duration_ms integer,
                                                   p_rate double precision DEFAULT NULL,
                                                   p_burst double precision DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer_api.authenticate(p_fingerprint);
    PERFORM querylayer.refuse_rate(querylayer.take_token('connection'::text, querylayer.ctx_connection_id()::text,
                                                         p_rate, p_burst), 'connection'::text);
    PERFORM querylayer_api.record_tool_call(p_tool, 'ok'::text, p_duration_ms, NULL::text);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.record_tool_call, querylayer_api.open_tool_call,
    querylayer_api.finish_tool_call, querylayer_api.close_tool_call, querylayer_api.record_refused_tool_call, querylayer_api.open_replica_read,
    querylayer_api.record_replica_read TO querylayer_edge;
