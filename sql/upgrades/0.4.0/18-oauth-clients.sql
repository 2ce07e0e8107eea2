-- Issue 18: a client_id may be the https URL of a Client ID Metadata Document (the check calls
-- querylayer.oauth_document_url_valid, created with the functions); the lifetime of an
-- authorization code is a setting (oauth_code_ttl_seconds).
ALTER TABLE querylayer.oauth_clients DROP CONSTRAINT oauth_clients_client_id_check;
ALTER TABLE querylayer.oauth_clients ADD CONSTRAINT oauth_clients_client_id_check
    CHECK (client_id ~ '^qlo_[0-9a-f]{32}$' OR querylayer.oauth_document_url_valid(client_id));
ALTER TABLE querylayer.settings DROP CONSTRAINT settings_key_check;
ALTER TABLE querylayer.settings ADD CONSTRAINT settings_key_check
    CHECK (key IN ('server_did', 'envelope_require_v2', 'envelope_freshness_seconds',
                   'evidence_reverify_after_days', 'form_rejected_retention_days',
                   'ledger_lock_timeout_ms', 'run_deadline_default_seconds',
                   'run_deadline_max_seconds', 'idempotency_key_ttl_hours',
                   'audit_retention_days', 'readiness_min_free_mb',
                   'oauth_code_ttl_seconds'));
INSERT INTO querylayer.settings (key, value) VALUES ('oauth_code_ttl_seconds', '60') ON CONFLICT (key) DO NOTHING;
