-- Issue 14: the settings of faults and retention (sql/095_envelopes.sql).
ALTER TABLE querylayer.settings DROP CONSTRAINT settings_key_check;
ALTER TABLE querylayer.settings ADD CONSTRAINT settings_key_check
    CHECK (key IN ('server_did', 'envelope_require_v2', 'envelope_freshness_seconds',
                   'evidence_reverify_after_days', 'form_rejected_retention_days',
                   'ledger_lock_timeout_ms', 'run_deadline_default_seconds',
                   'run_deadline_max_seconds', 'idempotency_key_ttl_hours',
                   'audit_retention_days', 'readiness_min_free_mb'));
INSERT INTO querylayer.settings (key, value) VALUES
    ('ledger_lock_timeout_ms', '5000'),
    ('run_deadline_default_seconds', '86400'),
    ('run_deadline_max_seconds', '604800'),
    ('idempotency_key_ttl_hours', '24'),
    ('audit_retention_days', '90'),
    ('readiness_min_free_mb', '64')
ON CONFLICT (key) DO NOTHING;
