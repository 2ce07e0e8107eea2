-- Issue 14: size limits of stored values (sql/150_limits.sql): the table and its triggers.
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
ALTER TABLE querylayer.value_limits OWNER TO querylayer_owner;
