-- Issue 18: Client ID Metadata Documents (sql/190_oauth.sql). Before the functions: the table
-- querylayer.oauth_client_now reads, and the 0.3.0 signature of oauth_consent, which gained
-- p_new_agent (CREATE OR REPLACE cannot add a parameter).
CREATE TABLE querylayer.oauth_client_documents (
    client_id       text NOT NULL REFERENCES querylayer.oauth_clients ON DELETE RESTRICT,
    fetched_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    document_sha256 bytea NOT NULL CHECK (length(document_sha256) = 32),
    client_name     text NOT NULL CHECK (client_name ~ '^[^[:cntrl:]]{1,120}$'),
    redirect_uris   text[] NOT NULL CHECK (cardinality(redirect_uris) BETWEEN 1 AND 8),
    PRIMARY KEY (client_id, fetched_at)
);
DROP FUNCTION querylayer_api.oauth_consent(text, text, text, text, text, text, text[], timestamptz);
-- oauth_register_client takes the registering address and its rate (sql/157_rate.sql).
DROP FUNCTION querylayer_api.oauth_register_client(text, text[]);
