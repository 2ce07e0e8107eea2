-- Bounded storage: the largest value of every column that agents and members fill, enforced by
-- the tables themselves (a BEFORE trigger that fires before any other), so every path — the
-- edge, psql, a future function — meets the same limit and the same error: QL413 naming the
-- argument. docs/api.md lists the same table (a test holds the two together).

CREATE TABLE querylayer.value_limits (
    table_name  text NOT NULL,       -- unqualified: the table is in schema querylayer
    column_name text NOT NULL,
    argument    text NOT NULL,       -- the name callers give the value (tool argument, body field)
    max_bytes   integer NOT NULL CHECK (max_bytes > 0),
    PRIMARY KEY (table_name, column_name)
);
INSERT INTO querylayer.value_limits (table_name, column_name, argument, max_bytes) VALUES
    ('runs',                   'input',                 'input',                 65536),
    ('runs',                   'required_outputs',      'required_outputs',      16384),
    ('runs',                   'completion_conditions', 'completion_conditions', 32768),
    ('run_events',             'summary',               'summary',               16384),
    ('run_events',             'reasons',               'reasons',               16384),
    ('run_artifacts',          'value',                 'value',                 1048576),
    ('run_artifacts',          'affected_objects',      'affected_objects',      65536),
    ('content_revisions',      'fields',                'fields',                1048576),
    ('proposals',              'payload',               'payload',               262144),
    ('console_turns',          'result',                'result',                65536),
    ('console_turns',          'failure_reason',        'failure_reason',        4096),
    ('task_plans',             'failure_reason',        'reason',                4096),
    ('task_steps',             'result',                'result',                65536),
    ('task_steps',             'failure_reason',        'failure_reason',        4096),
    ('content_source_packages', 'source',               'source',                2048),
    ('content_source_records', 'record',                'records[]',             65536),
    ('strategy_opportunities', 'rationale',             'rationale',             4096),
    ('strategy_opportunities', 'signals',               'signals',               16384),
    ('semantic_models',        'document',              'document',              1048576),
    ('rights_documents',       'document',              'document',              1048576),
    ('access_receipts',        'resource',              'resource',              1024),
    ('access_receipts',        'purpose',               'purpose',               1024),
    ('answers',                'question',              'question',              4096),
    ('answers',                'purpose',               'purpose',               1024),
    ('answer_drafts',          'purpose',               'purpose',               1024),
    ('form_screening_events',  'payload',               'events[].payload',      16384),
    ('form_screening_events',  'raw_signals',           'events[].raw_signals',  16384),
    ('form_screening_events',  'contact',               'events[].contact',      1024),
    ('form_screening_events',  'actor',                 'events[].actor',        1024),
    ('form_screening_events',  'network_marker',        'events[].network_marker', 256),
    ('connections',            'revoked_reason',        'reason',                1000),
    ('member_tokens',          'revoked_reason',        'reason',                1000),
    ('agent_sessions',         'ended_reason',          'reason',                1000),
    ('evidence_reviews',       'reviewer_note',         'note',                  4000);

-- The size a value takes as its caller sent it: a string's UTF-8 bytes, any other value's JSON text.
CREATE FUNCTION querylayer.value_bytes(p_value jsonb) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE jsonb_typeof(p_value)
               WHEN 'string' THEN octet_length(p_value #>> '{}')
               WHEN 'null' THEN 0
               ELSE octet_length(p_value::text) END;
END
$$;

-- The limits' trigger, in C (extension/src/limits.rs): each limited column of the row, measured
-- as querylayer.value_bytes measures its jsonb (a string's bytes, nothing for null, any other
-- value's JSON text), against its limit; the first one over it is refused (QL413, naming the
-- argument). A restore (querylayer.restoring()) brings rows back as they were dumped, even one
-- stored before its limit existed. Each backend keeps the limits it read, until value_limits
-- changes (catalog_changed below).
CREATE FUNCTION querylayer.enforce_value_limits() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'enforce_value_limits';

CREATE TRIGGER zz_catalog_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON querylayer.value_limits
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.catalog_changed();
ALTER TABLE querylayer.value_limits ENABLE ALWAYS TRIGGER zz_catalog_changed;

-- "a0_" fires before every other row trigger (guards, the chain): an oversized value is refused
-- before anything else is computed from it.
CREATE FUNCTION querylayer.limit_values(p_table regclass, p_updates boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER a0_value_limits BEFORE INSERT%s ON %s
                    FOR EACH ROW EXECUTE FUNCTION querylayer.enforce_value_limits()',
                   CASE WHEN p_updates THEN ' OR UPDATE' ELSE '' END, p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER a0_value_limits', p_table);
END
$$;

SELECT querylayer.limit_values('querylayer.runs'::regclass);
SELECT querylayer.limit_values('querylayer.run_events'::regclass);
SELECT querylayer.limit_values('querylayer.run_artifacts'::regclass);
SELECT querylayer.limit_values('querylayer.content_revisions'::regclass);
SELECT querylayer.limit_values('querylayer.proposals'::regclass);
SELECT querylayer.limit_values('querylayer.console_turns'::regclass, true);
SELECT querylayer.limit_values('querylayer.task_plans'::regclass, true);
SELECT querylayer.limit_values('querylayer.task_steps'::regclass, true);
SELECT querylayer.limit_values('querylayer.content_source_packages'::regclass);
SELECT querylayer.limit_values('querylayer.content_source_records'::regclass);
SELECT querylayer.limit_values('querylayer.strategy_opportunities'::regclass);
SELECT querylayer.limit_values('querylayer.semantic_models'::regclass);
SELECT querylayer.limit_values('querylayer.rights_documents'::regclass);
SELECT querylayer.limit_values('querylayer.access_receipts'::regclass);
SELECT querylayer.limit_values('querylayer.answers'::regclass);
SELECT querylayer.limit_values('querylayer.answer_drafts'::regclass);
SELECT querylayer.limit_values('querylayer.form_screening_events'::regclass);
SELECT querylayer.limit_values('querylayer.connections'::regclass, true);
SELECT querylayer.limit_values('querylayer.member_tokens'::regclass, true);
SELECT querylayer.limit_values('querylayer.agent_sessions'::regclass, true);
SELECT querylayer.limit_values('querylayer.evidence_reviews'::regclass, true);

-- The limits, for the documentation test and for operators.
CREATE FUNCTION querylayer_api.value_limits()
RETURNS TABLE (table_name text, column_name text, argument text, max_bytes integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT l.table_name, l.column_name, l.argument, l.max_bytes
                   FROM querylayer.value_limits l ORDER BY l.table_name, l.column_name;
END
$$;
GRANT EXECUTE ON FUNCTION querylayer_api.value_limits TO querylayer_edge;
