-- Envelope-bound connections and the /v1 envelope contract (docs/envelope.md): the envelope
-- settings, did:key bindings and their challenges, the replay ledger of v2 nonces, and an
-- append-only receipt per decision.

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
SELECT querylayer.decides_liveness('querylayer.did_bindings'::regclass);
SELECT querylayer.make_append_only('querylayer.did_bindings'::regclass);

-- Which functions a signed /v1 request may run: a context made by authenticate_envelope runs
-- only the functions mapped to the method and path its envelope signed (require_connection_for).
CREATE TABLE querylayer.envelope_routes (
    method        text NOT NULL CHECK (method ~ '^[A-Z]{1,16}$'),
    path          text NOT NULL CHECK (path ~ '^/[!-~]*$' AND length(path) <= 512),
    function_name text NOT NULL CHECK (function_name ~ '^querylayer_api\.[a-z_]+$'),
    PRIMARY KEY (method, path, function_name)
);
INSERT INTO querylayer.envelope_routes (method, path, function_name) VALUES
    ('POST', '/v1/answer', 'querylayer_api.answer_signed_request'),
    ('POST', '/v1/answer', 'querylayer_api.prepare_signed_answer'),
    ('POST', '/v1/answer', 'querylayer_api.complete_answer'),
    ('POST', '/v1/models/import/osi', 'querylayer_api.import_semantic_model');

-- Proof of possession for binding a did:key. A did:key is public, so binding one takes a
-- signature by that key over a fresh challenge: random, for one key on one site, single use,
-- valid five minutes. The signed text is querylayer.did_binding_message (docs/envelope.md).
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

CREATE FUNCTION querylayer.issue_did_challenge(p_site_id uuid, p_did text, p_issued_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_challenge text := 'qlch_' || replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    v_site      querylayer.sites;
    v_expires   timestamptz := clock_timestamp() + interval '5 minutes';
BEGIN
    IF p_did IS NULL OR NOT querylayer.did_key_valid(p_did) THEN
        RAISE EXCEPTION 'did: % is not an Ed25519 did:key (did:key:z6Mk…)', coalesce(quote_literal(left(p_did, 100)), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    -- Challenges are working state, not history: expired and used ones go.
    DELETE FROM querylayer.did_challenges
     WHERE site_id = p_site_id AND (expires_at < clock_timestamp() OR used_at IS NOT NULL);
    IF (SELECT count(*) FROM querylayer.did_challenges WHERE site_id = p_site_id) >= 100 THEN
        RAISE EXCEPTION 'this site has 100 open did:key challenges; wait for them to expire (5 minutes)'
            USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO querylayer.did_challenges (challenge, site_id, did, expires_at, issued_by)
    VALUES (v_challenge, p_site_id, p_did, v_expires, p_issued_by);
    RETURN jsonb_build_object(
        'challenge', v_challenge, 'did', p_did, 'site', v_site.slug, 'expires_at', v_expires,
        'message', querylayer.did_binding_message(p_did, v_site.slug, v_challenge),
        'sign_with', format('querylayer envelope prove --site %s --challenge %s --key-file <the key>', v_site.slug, v_challenge));
END
$$;

-- Spends the challenge of a binding proof {"challenge", "signature"} and checks the signature
-- by p_did over the binding message. Refuses anything else, naming the field.
CREATE FUNCTION querylayer.check_did_proof(p_site_id uuid, p_did text, p_proof jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_site      querylayer.sites;
    v_challenge text;
BEGIN
    IF p_proof IS NULL OR jsonb_typeof(p_proof) IS DISTINCT FROM 'object'
       OR jsonb_typeof(p_proof->'challenge') IS DISTINCT FROM 'string'
       OR jsonb_typeof(p_proof->'signature') IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'did_proof: binding a did:key requires proof that its holder consents: {"challenge", "signature"}'
            USING ERRCODE = '22023',
                  HINT = 'get a challenge (querylayer admin create-did-challenge, or POST /api/console/did-challenges), have the key''s holder sign it (querylayer envelope prove), and pass both';
    END IF;
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    UPDATE querylayer.did_challenges SET used_at = clock_timestamp()
     WHERE challenge = p_proof->>'challenge' AND site_id = p_site_id AND did = p_did
       AND used_at IS NULL AND expires_at > clock_timestamp()
    RETURNING challenge INTO v_challenge;
    IF v_challenge IS NULL THEN
        RAISE EXCEPTION 'did_proof: the challenge is unknown, used, expired, or was issued for another key or site'
            USING ERRCODE = 'QL403', HINT = 'get a fresh challenge for this key on this site';
    END IF;
    IF NOT querylayer.did_key_signature_valid(p_did, querylayer.did_binding_message(p_did, v_site.slug, v_challenge),
                                             p_proof->>'signature') THEN
        RAISE EXCEPTION 'did_proof: the signature does not verify with the key being bound'
            USING ERRCODE = 'QL403', HINT = 'only the key''s holder can sign the challenge; its private key is never sent';
    END IF;
END
$$;

-- A challenge for binding a did:key to a connection of p_site: the key's holder signs it
-- (`querylayer envelope prove`), and create_connection takes the signature as p_did_proof.
CREATE FUNCTION querylayer_api.create_did_challenge(p_site text, p_did text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN querylayer.issue_did_challenge(v_site.id, p_did, 'operator:' || querylayer.outer_user());
END
$$;

-- A challenge for binding a did:key on the member's site (owner, admin): the key's holder signs
-- it, and console_create_connection takes the signature as the proof of possession.
CREATE FUNCTION querylayer_api.console_create_did_challenge(p_did text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    RETURN querylayer.issue_did_challenge(querylayer.ctx_site_id(), p_did, 'member:' || querylayer.ctx_member_id());
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_create_did_challenge TO querylayer_edge;

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
    checks        jsonb
) PARTITION BY RANGE (at);
ALTER SEQUENCE querylayer.envelope_receipt_ids OWNED BY querylayer.envelope_receipts.id;
ALTER TABLE querylayer.envelope_receipts ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.envelope_receipts FORCE ROW LEVEL SECURITY;
CREATE POLICY receipts_read ON querylayer.envelope_receipts FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY receipts_write ON querylayer.envelope_receipts FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.envelope_receipts'::regclass);
-- Each partition has the key (id, at).
SELECT querylayer.age_by_month('querylayer.envelope_receipts'::regclass, 'at'::name, ARRAY['id', 'at']::text[]);

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

CREATE FUNCTION querylayer_api.list_envelope_receipts(p_site text DEFAULT NULL, p_limit integer DEFAULT 100)
RETURNS TABLE (at timestamptz, allowed boolean, method text, path text, profile text, sender text, error text, checks jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.page_limit(p_limit);
    IF p_site IS NOT NULL THEN
        v_site := querylayer.enter_operator_site(p_site);
    END IF;
    RETURN QUERY SELECT r.at, r.allowed, r.method, r.path, r.profile, r.sender, r.error, r.checks
                   FROM querylayer.envelope_receipts r
                  WHERE r.site_id IS NOT DISTINCT FROM v_site.id
                  ORDER BY r.id DESC LIMIT p_limit;
END
$$;
