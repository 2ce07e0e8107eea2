-- Envelope-bound connections and the /v1 envelope contract (docs/envelope.md): server settings,
-- did:key bindings, the replay ledger of v2 nonces, and an append-only receipt per decision.

CREATE TABLE querylayer.settings (
    key        text PRIMARY KEY CHECK (key IN ('server_did', 'envelope_require_v2', 'envelope_freshness_seconds',
                                                 'evidence_reverify_after_days', 'form_rejected_retention_days',
                                                 'ledger_lock_timeout_ms', 'run_deadline_default_seconds',
                                                 'run_deadline_max_seconds', 'idempotency_key_ttl_hours',
                                                 'audit_retention_days', 'readiness_min_free_mb')),
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL DEFAULT 'install'
);
INSERT INTO querylayer.settings (key, value) VALUES
    ('server_did', '"did:web:qg-server"'),
    ('envelope_require_v2', 'false'),
    ('envelope_freshness_seconds', '300'),
    ('evidence_reverify_after_days', '30'),
    ('form_rejected_retention_days', '30'),
    -- Staying up under faults (docs/edge.md, "Faults and retries").
    ('ledger_lock_timeout_ms', '5000'),
    ('run_deadline_default_seconds', '86400'),
    ('run_deadline_max_seconds', '604800'),
    ('idempotency_key_ttl_hours', '24'),
    ('audit_retention_days', '90'),
    ('readiness_min_free_mb', '64');

CREATE FUNCTION querylayer.setting_int(p_key text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT (value #>> '{}')::integer FROM querylayer.settings WHERE key = p_key);
END
$$;

CREATE FUNCTION querylayer.envelope_settings() RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'server_did', (SELECT value #>> '{}' FROM querylayer.settings WHERE key = 'server_did'),
        'require_v2', (SELECT (value #>> '{}')::boolean FROM querylayer.settings WHERE key = 'envelope_require_v2'),
        'freshness_seconds', (SELECT (value #>> '{}')::bigint FROM querylayer.settings WHERE key = 'envelope_freshness_seconds'),
        'now', floor(extract(epoch FROM clock_timestamp()))::bigint));
END
$$;

-- A connection's did:key. The newest binding of a key wins; binding a key that a live
-- connection holds is refused (issue_connection).
CREATE TABLE querylayer.did_bindings (
    connection_id   uuid PRIMARY KEY REFERENCES querylayer.connections ON DELETE RESTRICT,
    did             text NOT NULL CHECK (querylayer.did_key_valid(did)),
    did_sha256      bytea NOT NULL,
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    bound_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (did_sha256 = querylayer.did_key_sha256(did))
);
CREATE INDEX did_bindings_lookup ON querylayer.did_bindings (did_sha256, bound_at DESC);
ALTER TABLE querylayer.did_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.did_bindings FORCE ROW LEVEL SECURITY;
-- Like credentials: visible only while the extension resolves that very key.
CREATE POLICY did_lookup ON querylayer.did_bindings FOR SELECT
    USING (did_sha256 = querylayer.ctx_presented_fingerprint());
CREATE POLICY did_bind ON querylayer.did_bindings FOR INSERT
    WITH CHECK (site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.did_bindings');

-- v2 nonces, per sender, kept while an envelope carrying them could still be fresh.
CREATE TABLE querylayer.envelope_nonces (
    sender     text NOT NULL,
    nonce      text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (sender, nonce)
);
CREATE INDEX envelope_nonces_expiry ON querylayer.envelope_nonces (expires_at);

-- Records a nonce; false when the sender already used it within the window. An envelope is
-- fresh while |created_at - now| <= window, so after 2 × window its nonce can be forgotten.
CREATE FUNCTION querylayer.spend_nonce(p_sender text, p_nonce text, p_window_seconds bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM querylayer.envelope_nonces WHERE expires_at < clock_timestamp();
    INSERT INTO querylayer.envelope_nonces (sender, nonce, expires_at)
    VALUES (p_sender, p_nonce, clock_timestamp() + make_interval(secs => 2 * p_window_seconds))
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Receipts are access records: partitioned by month, they age out like the audit trail.
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
    checks        jsonb,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
ALTER SEQUENCE querylayer.envelope_receipt_ids OWNED BY querylayer.envelope_receipts.id;
ALTER TABLE querylayer.envelope_receipts ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.envelope_receipts FORCE ROW LEVEL SECURITY;
CREATE POLICY receipts_read ON querylayer.envelope_receipts FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY receipts_write ON querylayer.envelope_receipts FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.envelope_receipts');
SELECT querylayer.age_by_month('querylayer.envelope_receipts', 'at');

CREATE FUNCTION querylayer.record_envelope_receipt(p jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO querylayer.envelope_receipts (site_id, connection_id, allowed, path, method, profile, sender, error, checks)
    VALUES (CASE WHEN (p->>'allowed')::boolean THEN querylayer.ctx_site_id() END,
            (p->>'connection_id')::uuid, (p->>'allowed')::boolean, p->>'path', p->>'method',
            p->>'profile', p->>'sender', p->>'error', p->'checks');
END
$$;

-- -------------------------------------------------------------------------------------------
-- Operators.

-- The integer settings of faults and retention, each within its range.
CREATE FUNCTION querylayer.integer_setting(p_key text, p_value text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_min integer;
    v_max integer;
    v_unit text;
BEGIN
    SELECT lo, hi, unit INTO v_min, v_max, v_unit FROM (VALUES
        ('ledger_lock_timeout_ms', 100, 60000, 'milliseconds'),
        ('run_deadline_default_seconds', 1, 31536000, 'seconds'),
        ('run_deadline_max_seconds', 1, 31536000, 'seconds'),
        ('idempotency_key_ttl_hours', 1, 8760, 'hours'),
        ('audit_retention_days', 1, 36500, 'days'),
        ('readiness_min_free_mb', 0, 1048576, 'MiB')) AS r(key, lo, hi, unit)
     WHERE r.key = p_key;
    IF p_value IS NULL OR p_value !~ '^[0-9]{1,9}$' OR p_value::integer NOT BETWEEN v_min AND v_max THEN
        RAISE EXCEPTION '% must be a number of % between % and %', p_key, v_unit, v_min, v_max USING ERRCODE = '22023';
    END IF;
    IF p_key = 'run_deadline_default_seconds'
       AND p_value::integer > querylayer.setting_int('run_deadline_max_seconds') THEN
        RAISE EXCEPTION 'run_deadline_default_seconds may not exceed run_deadline_max_seconds (%)',
            querylayer.setting_int('run_deadline_max_seconds') USING ERRCODE = '22023';
    END IF;
    IF p_key = 'run_deadline_max_seconds'
       AND p_value::integer < querylayer.setting_int('run_deadline_default_seconds') THEN
        RAISE EXCEPTION 'run_deadline_max_seconds may not be below run_deadline_default_seconds (%)',
            querylayer.setting_int('run_deadline_default_seconds') USING ERRCODE = '22023';
    END IF;
    RETURN p_value::integer;
END
$$;

CREATE FUNCTION querylayer_api.set_setting(p_key text, p_value text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v jsonb;
BEGIN
    PERFORM querylayer.enter_operator(NULL);
    CASE p_key
        WHEN 'server_did' THEN
            IF p_value !~ '^did:[a-z0-9]+:[A-Za-z0-9._:%-]+$' THEN
                RAISE EXCEPTION 'server_did must be a DID such as did:web:example.com; got %', quote_literal(p_value)
                    USING ERRCODE = '22023';
            END IF;
            v := to_jsonb(p_value);
        WHEN 'envelope_require_v2' THEN
            IF lower(p_value) NOT IN ('true', 'false') THEN
                RAISE EXCEPTION 'envelope_require_v2 must be true or false' USING ERRCODE = '22023';
            END IF;
            v := to_jsonb(lower(p_value)::boolean);
        WHEN 'envelope_freshness_seconds' THEN
            IF p_value !~ '^[0-9]{1,5}$' OR p_value::integer NOT BETWEEN 10 AND 3600 THEN
                RAISE EXCEPTION 'envelope_freshness_seconds must be between 10 and 3600' USING ERRCODE = '22023';
            END IF;
            v := to_jsonb(p_value::integer);
        WHEN 'evidence_reverify_after_days', 'form_rejected_retention_days' THEN
            IF p_value !~ '^[0-9]{1,4}$' OR p_value::integer NOT BETWEEN 0 AND 3650 THEN
                RAISE EXCEPTION '% must be a number of days between 0 and 3650', p_key USING ERRCODE = '22023';
            END IF;
            v := to_jsonb(p_value::integer);
        WHEN 'ledger_lock_timeout_ms', 'run_deadline_default_seconds', 'run_deadline_max_seconds',
             'idempotency_key_ttl_hours', 'audit_retention_days', 'readiness_min_free_mb' THEN
            v := to_jsonb(querylayer.integer_setting(p_key, p_value));
        ELSE
            RAISE EXCEPTION 'unknown setting %; known: %', coalesce(quote_literal(p_key), 'NULL'),
                (SELECT string_agg(key, ', ' ORDER BY key) FROM querylayer.settings) USING ERRCODE = '22023';
    END CASE;
    UPDATE querylayer.settings SET value = v, updated_at = now(), updated_by = querylayer.outer_user() WHERE key = p_key;
    PERFORM querylayer.audit('setting.set', p_key, jsonb_build_object('value', v));
    RETURN querylayer_api.get_settings();
END
$$;

CREATE FUNCTION querylayer_api.get_settings() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL);
    RETURN (SELECT jsonb_object_agg(key, value ORDER BY key) FROM querylayer.settings);
END
$$;

CREATE FUNCTION querylayer_api.list_envelope_receipts(p_site text DEFAULT NULL, p_limit integer DEFAULT 100)
RETURNS TABLE (at timestamptz, allowed boolean, method text, path text, profile text, sender text, error text, checks jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    PERFORM querylayer.enter_operator(NULL);
    IF p_site IS NOT NULL THEN
        v_site := querylayer.site_by_slug(p_site);
        PERFORM querylayer.enter_operator(v_site.id);
    END IF;
    RETURN QUERY SELECT r.at, r.allowed, r.method, r.path, r.profile, r.sender, r.error, r.checks
                   FROM querylayer.envelope_receipts r
                  WHERE r.site_id IS NOT DISTINCT FROM v_site.id
                  ORDER BY r.id DESC LIMIT p_limit;
END
$$;
