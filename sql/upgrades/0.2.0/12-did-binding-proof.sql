-- Issue 12: the challenges a did:key's holder signs to prove possession when the key is bound.
-- Working state (single use, five minutes), not history.
CREATE TABLE querylayer.did_challenges (
    challenge  text PRIMARY KEY CHECK (challenge ~ '^qlch_[0-9a-f]{64}$'),
    site_id    uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    did        text NOT NULL CHECK (querylayer.did_key_valid(did)),
    issued_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    issued_by  text NOT NULL,
    used_at    timestamptz
);
CREATE INDEX did_challenges_site_expiry ON querylayer.did_challenges (site_id, expires_at);
SELECT querylayer.isolate_by_site('querylayer.did_challenges'::regclass);
