-- Server-wide settings: one row per key, read by the functions of every domain (envelopes,
-- evidence, forms, the ledger's lock timeout, run deadlines, idempotency, retention,
-- readiness), set only by operators (querylayer admin set-setting).

CREATE TABLE querylayer.settings (
    key        text PRIMARY KEY CHECK (key IN ('server_did', 'envelope_require_v2', 'envelope_freshness_seconds',
                                                 'evidence_reverify_after_days', 'form_rejected_retention_days',
                                                 'ledger_lock_timeout_ms', 'run_deadline_default_seconds',
                                                 'run_deadline_max_seconds', 'idempotency_key_ttl_hours',
                                                 'audit_retention_days', 'readiness_min_free_mb',
                                                 'oauth_code_ttl_seconds')),
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
    ('readiness_min_free_mb', '64'),
    -- How long an OAuth authorization code may wait for its redemption (sql/190_oauth.sql).
    ('oauth_code_ttl_seconds', '60');

-- A restore (docs/operations.md) brings every setting as it was dumped, in place of the row this
-- install seeded. Fires in replica mode only, and only a restoring superuser gets past the test.
CREATE FUNCTION querylayer.restore_setting() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF querylayer.restoring() THEN
        DELETE FROM querylayer.settings WHERE key = NEW.key;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER restore_over_seed BEFORE INSERT ON querylayer.settings
    FOR EACH ROW EXECUTE FUNCTION querylayer.restore_setting();
ALTER TABLE querylayer.settings ENABLE REPLICA TRIGGER restore_over_seed;

CREATE FUNCTION querylayer.setting_int(p_key text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT (value #>> '{}')::integer FROM querylayer.settings WHERE key = p_key);
END
$$;

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
        ('readiness_min_free_mb', 0, 1048576, 'MiB'),
        ('oauth_code_ttl_seconds', 1, 600, 'seconds')) AS r(key, lo, hi, unit)
     WHERE r.key = p_key;
    IF p_value IS NULL OR p_value !~ '^[0-9]{1,9}$' OR p_value::integer NOT BETWEEN v_min AND v_max THEN
        RAISE EXCEPTION '% must be a number of % between % and %', p_key, v_unit, v_min, v_max USING ERRCODE = '22023';
    END IF;
    IF p_key = 'run_deadline_default_seconds'
       AND p_value::integer > querylayer.setting_int('run_deadline_max_seconds'::text) THEN
        RAISE EXCEPTION 'run_deadline_default_seconds may not exceed run_deadline_max_seconds (%)',
            querylayer.setting_int('run_deadline_max_seconds'::text) USING ERRCODE = '22023';
    END IF;
    IF p_key = 'run_deadline_max_seconds'
       AND p_value::integer < querylayer.setting_int('run_deadline_default_seconds'::text) THEN
        RAISE EXCEPTION 'run_deadline_max_seconds may not be below run_deadline_default_seconds (%)',
            querylayer.setting_int('run_deadline_default_seconds'::text) USING ERRCODE = '22023';
    END IF;
    RETURN p_value::integer;
END
$$;

CREATE FUNCTION querylayer_api.set_setting(p_key text, p_value text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v jsonb;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
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
             'idempotency_key_ttl_hours', 'audit_retention_days', 'readiness_min_free_mb', 'oauth_code_ttl_seconds' THEN
            v := to_jsonb(querylayer.integer_setting(p_key, p_value));
        ELSE
            RAISE EXCEPTION 'unknown setting %; known: %', coalesce(quote_literal(p_key), 'NULL'),
                (SELECT string_agg(key, ', ' ORDER BY key) FROM querylayer.settings) USING ERRCODE = '22023';
    END CASE;
    UPDATE querylayer.settings SET value = v, updated_at = now(), updated_by = querylayer.outer_user() WHERE key = p_key;
    PERFORM querylayer.audit('setting.set'::text, p_key, jsonb_build_object('value', v));
    RETURN querylayer_api.get_settings();
END
$$;

CREATE FUNCTION querylayer_api.get_settings() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    RETURN (SELECT jsonb_object_agg(key, value ORDER BY key) FROM querylayer.settings);
END
$$;
