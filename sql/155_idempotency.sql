-- Idempotent writes. A client that cannot tell whether a write committed (a timeout, a dropped
-- connection, a crash of the database or of the edge) retries it with the same idempotency key.
-- The key is claimed in the write's own transaction: the first call inserts it with the SHA-256
-- of its request and stores its answer before commit; a retry finds the committed answer and
-- returns it without a second effect; a concurrent duplicate waits on the primary key until the
-- first commits (then finds its answer) or rolls back (then goes ahead itself). The same key
-- with other arguments is refused (QLI09). Keys live idempotency_key_ttl_hours (24 by default),
-- then apply_retention deletes them.

CREATE TABLE querylayer.idempotency_keys (
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    principal_id   uuid NOT NULL,     -- the connection, or the member
    key            text NOT NULL CHECK (length(key) <= 255 AND key ~ '^[!-~]+$'),
    action         text NOT NULL CHECK (length(action) BETWEEN 1 AND 200),
    request_sha256 bytea NOT NULL CHECK (length(request_sha256) = 32),
    response       jsonb,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (site_id, principal_id, key)
);
CREATE INDEX idempotency_keys_expiry ON querylayer.idempotency_keys (site_id, expires_at);
SELECT querylayer.isolate_by_site('querylayer.idempotency_keys'::regclass);

CREATE FUNCTION querylayer.idempotency_principal() RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF querylayer.ctx_kind() = 'connection' THEN
        -- Not under an envelope's context: it runs only the functions of the route it signed.
        PERFORM querylayer.require_connection(NULL::text);
        RETURN querylayer.ctx_connection_id();
    ELSIF querylayer.ctx_kind() = 'member' THEN
        RETURN querylayer.ctx_member_id();
    END IF;
    RAISE EXCEPTION 'no authenticated connection or member in this transaction' USING ERRCODE = 'QL401',
        HINT = 'authenticate first, in the same transaction';
END
$$;

-- Claims p_key for the authenticated connection or member, for one action (the tool or the
-- console route) and one request (the SHA-256 of its arguments). NULL: the key is new, the
-- call goes ahead and store_idempotent_response records its answer in the same transaction.
-- {"response", "first_at"}: the call already committed under this key; its answer, unchanged.
CREATE FUNCTION querylayer_api.claim_idempotency_key(p_key text, p_action text, p_request_sha256 bytea)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_principal uuid := querylayer.idempotency_principal();
    v_expires   timestamptz := clock_timestamp() + make_interval(hours => querylayer.setting_int('idempotency_key_ttl_hours'::text));
    v           querylayer.idempotency_keys;
BEGIN
    IF p_key IS NULL OR length(p_key) > 255 OR p_key !~ '^[!-~]+$' THEN
        RAISE EXCEPTION 'idempotency_key must be 1 to 255 printable ASCII characters without spaces'
            USING ERRCODE = '22023';
    END IF;
    IF p_request_sha256 IS NULL OR length(p_request_sha256) <> 32 THEN
        RAISE EXCEPTION 'the request hash must be a SHA-256' USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.idempotency_keys (site_id, principal_id, key, action, request_sha256, expires_at)
    VALUES (querylayer.ctx_site_id(), v_principal, p_key, p_action, p_request_sha256, v_expires)
    ON CONFLICT (site_id, principal_id, key) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO v FROM querylayer.idempotency_keys
     WHERE site_id = querylayer.ctx_site_id() AND principal_id = v_principal AND key = p_key
       FOR UPDATE;
    IF v.expires_at <= clock_timestamp() THEN
        -- Past its window the key is forgotten: this is a new request.
        UPDATE querylayer.idempotency_keys
           SET action = p_action, request_sha256 = p_request_sha256, response = NULL,
               created_at = clock_timestamp(), expires_at = v_expires
         WHERE site_id = v.site_id AND principal_id = v.principal_id AND key = v.key;
        RETURN NULL;
    END IF;
    IF v.action <> p_action OR v.request_sha256 <> p_request_sha256 THEN
        RAISE EXCEPTION 'idempotency_key % was used for another request (%, at %)', p_key, v.action, v.created_at
            USING ERRCODE = 'QLI09',
                  HINT = 'a retry must repeat the first request exactly; use a new key for a new request';
    END IF;
    IF v.response IS NULL THEN
        RAISE EXCEPTION 'idempotency_key % is already claimed in this transaction', p_key USING ERRCODE = 'QL409';
    END IF;
    RETURN jsonb_build_object('response', v.response, 'first_at', v.created_at);
END
$$;

-- Records the answer of the call that claimed p_key, in the same transaction. A secret or a
-- token in the answer is never stored, nor a link that carries it (an invitation's `path`): a
-- replayed creation returns them as null.
CREATE FUNCTION querylayer_api.store_idempotent_response(p_key text, p_response jsonb) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_principal uuid := querylayer.idempotency_principal();
    v_response  jsonb := coalesce(p_response, 'null'::jsonb);
BEGIN
    IF jsonb_typeof(v_response) = 'object' THEN
        IF v_response ? 'secret' THEN
            v_response := jsonb_set(v_response, '{secret}', 'null');
        END IF;
        IF v_response ? 'token' THEN
            IF v_response ? 'path' AND strpos(v_response->>'path', v_response->>'token') > 0 THEN
                v_response := jsonb_set(v_response, '{path}', 'null');
            END IF;
            v_response := jsonb_set(v_response, '{token}', 'null');
        END IF;
    END IF;
    UPDATE querylayer.idempotency_keys SET response = v_response
     WHERE site_id = querylayer.ctx_site_id() AND principal_id = v_principal
       AND key = p_key AND response IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency_key % was not claimed in this transaction', p_key USING ERRCODE = 'QL409';
    END IF;
END
$$;

-- Deletes the keys past their window, on every site (apply_retention).
CREATE FUNCTION querylayer.reclaim_idempotency_keys() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_site  uuid;
    v_n     bigint;
    v_total bigint := 0;
BEGIN
    FOR v_site IN SELECT id FROM querylayer.sites LOOP
        PERFORM querylayer.enter_operator(v_site);
        DELETE FROM querylayer.idempotency_keys WHERE site_id = v_site AND expires_at <= clock_timestamp();
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;
    PERFORM querylayer.enter_operator(NULL::uuid);
    RETURN v_total;
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.claim_idempotency_key, querylayer_api.store_idempotent_response
    TO querylayer_edge;
