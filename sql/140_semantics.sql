-- The governed semantics plane (QueryGraph): semantic models (OSI) imported per site as
-- immutable versions, RBAC + ODRL rights documents, an append-only receipt for every access
-- decision, and the navigator loop's signed answers with their OpenLineage events and Ed25519
-- attestations. The algorithms are the querylayer-semantics crate (extension/src/semantic.rs);
-- what is loaded, who asks, and what is recorded is decided here. The server's signing key is
-- generated here and never leaves the database.

-- The server's Ed25519 keys. The newest unretired key signs; retired keys stay so that earlier
-- attestations remain verifiable against their published did:key. No role but the owner reads
-- this table.
CREATE TABLE querylayer.server_keys (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    did_key    text NOT NULL UNIQUE,
    secret     bytea NOT NULL CHECK (length(secret) = 32),
    origin     text NOT NULL CHECK (origin IN ('generated', 'operator')),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    retired_at timestamptz,
    CHECK (did_key = querylayer.key_did(secret))
);
CREATE UNIQUE INDEX server_keys_one_current ON querylayer.server_keys ((true)) WHERE retired_at IS NULL;
INSERT INTO querylayer.server_keys (did_key, secret, origin)
SELECT querylayer.key_did(s), s, 'generated' FROM (SELECT querylayer.new_key_secret() AS s) k;

-- A restore (docs/operations.md) brings the dumped keys. The key the empty database generated at
-- CREATE EXTENSION gives way to the dumped current key, provided nothing refers to it yet (it
-- signed nothing); otherwise the restore fails on the one-current-key index. Fires in replica
-- mode only, and only for a restoring superuser.
CREATE FUNCTION querylayer.restore_server_key() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_key  querylayer.server_keys;
    v_ref  record;
    v_used boolean;
BEGIN
    IF NOT querylayer.restoring() OR NEW.retired_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    SELECT * INTO v_key FROM querylayer.server_keys
     WHERE retired_at IS NULL AND origin = 'generated' AND id <> NEW.id;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    FOR v_ref IN SELECT c.conrelid::regclass AS tbl, a.attname
                   FROM pg_catalog.pg_constraint c
                   JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
                  WHERE c.contype = 'f' AND c.confrelid = 'querylayer.server_keys'::regclass LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %I = $1)', v_ref.tbl, v_ref.attname)
           INTO v_used USING v_key.id;
        IF v_used THEN
            RETURN NEW;
        END IF;
    END LOOP;
    DELETE FROM querylayer.server_keys WHERE id = v_key.id;
    RETURN NEW;
END
$$;
CREATE TRIGGER restore_over_generated_key BEFORE INSERT ON querylayer.server_keys
    FOR EACH ROW EXECUTE FUNCTION querylayer.restore_server_key();
ALTER TABLE querylayer.server_keys ENABLE REPLICA TRIGGER restore_over_generated_key;

CREATE FUNCTION querylayer.server_key() RETURNS querylayer.server_keys
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.server_keys;
BEGIN
    SELECT * INTO v FROM querylayer.server_keys WHERE retired_at IS NULL;
    RETURN v;
END
$$;

CREATE FUNCTION querylayer.utc_text(p_t timestamptz) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT to_char(p_t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
END
$$;

CREATE TABLE querylayer.semantic_models (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    version        integer NOT NULL CHECK (version > 0),
    name           text NOT NULL,
    document       jsonb NOT NULL,
    source_sha256  text NOT NULL,
    imported_by    text NOT NULL,
    connection_id  uuid REFERENCES querylayer.connections ON DELETE RESTRICT,
    imported_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (site_id, version)
);
SELECT querylayer.isolate_by_site('querylayer.semantic_models'::regclass);
SELECT querylayer.make_chained('querylayer.semantic_models'::regclass);

CREATE TABLE querylayer.rights_documents (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    version        integer NOT NULL CHECK (version > 0),
    document       jsonb NOT NULL,
    problems       jsonb NOT NULL,
    imported_by    text NOT NULL,
    imported_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (site_id, version)
);
SELECT querylayer.isolate_by_site('querylayer.rights_documents'::regclass);
SELECT querylayer.make_chained('querylayer.rights_documents'::regclass);

CREATE TABLE querylayer.access_receipts (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    principal      text NOT NULL,
    resource       text NOT NULL,
    action         text NOT NULL,
    purpose        text,
    allowed        boolean NOT NULL,
    reason         text NOT NULL,
    policy_id      text,
    issued_at      text NOT NULL,
    decided_for    text NOT NULL CHECK (decided_for IN ('check_access', 'answer', 'bundle', 'story')),
    answer_id      uuid,
    rights_id      uuid REFERENCES querylayer.rights_documents ON DELETE RESTRICT,
    connection_id  uuid REFERENCES querylayer.connections ON DELETE RESTRICT,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.access_receipts'::regclass);
SELECT querylayer.make_chained('querylayer.access_receipts'::regclass);

CREATE TABLE querylayer.answers (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    connection_id  uuid REFERENCES querylayer.connections ON DELETE RESTRICT,
    agent_id       uuid REFERENCES querylayer.agents ON DELETE RESTRICT,
    principal      text NOT NULL,
    purpose        text,
    question       text NOT NULL,
    answer         text NOT NULL,
    synthesized_by text NOT NULL,
    model_id       uuid NOT NULL REFERENCES querylayer.semantic_models ON DELETE RESTRICT,
    rights_id      uuid REFERENCES querylayer.rights_documents ON DELETE RESTRICT,
    plans          jsonb NOT NULL,
    denied_sources jsonb NOT NULL,
    envelope       jsonb NOT NULL,
    server_key_id  uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.answers'::regclass);
SELECT querylayer.make_chained('querylayer.answers'::regclass);

-- An answer prepared for an LLM on the edge, waiting for the text. Nothing is recorded as an
-- answer until it is completed and signed.
CREATE TABLE querylayer.answer_drafts (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    connection_id uuid NOT NULL REFERENCES querylayer.connections ON DELETE RESTRICT,
    purpose       text,
    navigation    jsonb NOT NULL,
    model_id      uuid NOT NULL REFERENCES querylayer.semantic_models ON DELETE RESTRICT,
    rights_id     uuid REFERENCES querylayer.rights_documents ON DELETE RESTRICT,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at  timestamptz
);
SELECT querylayer.isolate_by_site('querylayer.answer_drafts'::regclass);

-- The exact event text (json keeps the bytes the attestation's hash covers).
CREATE TABLE querylayer.lineage_events (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    answer_id      uuid REFERENCES querylayer.answers ON DELETE RESTRICT,
    story_agent    text,
    run_id         uuid NOT NULL,
    event          json NOT NULL,
    event_sha256   text NOT NULL CHECK (event_sha256 = encode(sha256(convert_to(event::text, 'UTF8')), 'hex')),
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.lineage_events'::regclass);
SELECT querylayer.make_chained('querylayer.lineage_events'::regclass);

CREATE TABLE querylayer.attestations (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id          uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    lineage_event_id uuid NOT NULL UNIQUE REFERENCES querylayer.lineage_events ON DELETE RESTRICT,
    server_key_id    uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    attestation      jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.attestations'::regclass);
SELECT querylayer.make_chained('querylayer.attestations'::regclass);

-- -------------------------------------------------------------------------------------------
-- Internals.

CREATE FUNCTION querylayer.current_model() RETURNS querylayer.semantic_models
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.semantic_models;
BEGIN
    SELECT * INTO v FROM querylayer.semantic_models WHERE site_id = querylayer.ctx_site_id() ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this site has no semantic model yet' USING ERRCODE = 'QL404',
            HINT = 'import one with POST /v1/models/import/osi or querylayer_import_semantic_model';
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION querylayer.current_rights() RETURNS querylayer.rights_documents
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.rights_documents;
BEGIN
    SELECT * INTO v FROM querylayer.rights_documents WHERE site_id = querylayer.ctx_site_id() ORDER BY version DESC LIMIT 1;
    RETURN v;
END
$$;

-- The acting agent's rights subject.
CREATE FUNCTION querylayer.acting_principal() RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT principal FROM querylayer.agents WHERE id = querylayer.ctx_agent_id());
END
$$;

-- With no rights document every decision denies (the engine reads an empty document as such).
CREATE FUNCTION querylayer.rights_or_empty(p querylayer.rights_documents) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN coalesce(p.document, '{}'::jsonb);
END
$$;

CREATE FUNCTION querylayer.record_receipts(p_receipts jsonb, p_for text, p_purpose text, p_answer_id uuid, p_rights_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO querylayer.access_receipts (site_id, principal, resource, action, purpose, allowed, reason, policy_id, issued_at,
                                            decided_for, answer_id, rights_id, connection_id)
    SELECT querylayer.ctx_site_id(), r->>'principal', r->>'resource', r->>'action', p_purpose, (r->>'allowed')::boolean,
           r->>'reason', r->>'policy_id', r->>'issued_at', p_for, p_answer_id, p_rights_id, querylayer.ctx_connection_id()
      FROM jsonb_array_elements(p_receipts) WITH ORDINALITY AS x(r, o) ORDER BY o;
END
$$;

CREATE FUNCTION querylayer.record_event(p_event_text text, p_attestation jsonb, p_answer_id uuid, p_story_agent text,
                                        p_key_id uuid) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    INSERT INTO querylayer.lineage_events (site_id, answer_id, story_agent, run_id, event, event_sha256)
    VALUES (querylayer.ctx_site_id(), p_answer_id, p_story_agent, (p_event_text::jsonb #>> '{run,runId}')::uuid,
            p_event_text::json, encode(sha256(convert_to(p_event_text, 'UTF8')), 'hex'))
    RETURNING id INTO v_id;
    INSERT INTO querylayer.attestations (site_id, lineage_event_id, server_key_id, attestation)
    VALUES (querylayer.ctx_site_id(), v_id, p_key_id, p_attestation);
    RETURN v_id;
END
$$;

-- Signs a navigation (optionally with LLM text) and records the answer, its receipts, its event
-- and its attestation. Returns the signed answer as clients see it.
CREATE FUNCTION querylayer.sign_and_record(p_nav jsonb, p_llm_text text, p_llm_name text, p_model querylayer.semantic_models,
                                           p_rights_id uuid, p_purpose text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_key       querylayer.server_keys := querylayer.server_key();
    v_principal text := querylayer.acting_principal();
    v_recipient text;
    v_signed    jsonb;
    v_answer    uuid;
    v_event     uuid;
BEGIN
    SELECT coalesce(c.did, v_principal) INTO v_recipient FROM querylayer.connections c WHERE c.id = querylayer.ctx_connection_id();
    v_signed := querylayer.sign_answer(p_nav, p_llm_text, p_llm_name, p_model.name, v_principal, v_recipient,
                                       v_key.secret, querylayer.utc_text(clock_timestamp()));
    INSERT INTO querylayer.answers (site_id, connection_id, agent_id, principal, purpose, question, answer, synthesized_by,
                                    model_id, rights_id, plans, denied_sources, envelope, server_key_id)
    VALUES (querylayer.ctx_site_id(), querylayer.ctx_connection_id(), querylayer.ctx_agent_id(), v_principal, p_purpose,
            v_signed->>'question', v_signed->>'answer', v_signed->>'synthesized_by', p_model.id, p_rights_id,
            v_signed->'plans', v_signed->'denied_sources', v_signed->'envelope', v_key.id)
    RETURNING id INTO v_answer;
    PERFORM querylayer.record_receipts(v_signed->'receipts', 'answer'::text, p_purpose, v_answer, p_rights_id);
    v_event := querylayer.record_event(v_signed->>'openlineage_text', v_signed->'attestation', v_answer, NULL::text, v_key.id);
    PERFORM querylayer.audit('semantics.answer'::text, v_answer::text,
        jsonb_build_object('denied', jsonb_array_length(v_signed->'denied_sources'), 'synthesized_by', v_signed->>'synthesized_by'));
    RETURN (v_signed - 'prompt') || jsonb_build_object('answer_id', v_answer, 'lineage_event_id', v_event,
                                                       'server_did', v_key.did_key, 'model_version', p_model.version);
END
$$;

-- Validates an OSI document and stores it as the site's next model version: the one path for
-- agents (import_semantic_model) and operators (import_semantic_model_as_operator).
CREATE FUNCTION querylayer.store_semantic_model(p_site_id uuid, p_document text, p_imported_by text,
                                                p_connection_id uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_parsed jsonb;
    v        querylayer.semantic_models;
BEGIN
    IF p_document IS NULL OR length(p_document) > 5000000 THEN
        RAISE EXCEPTION 'document: an OSI document of at most 5 MB is required' USING ERRCODE = '22023';
    END IF;
    v_parsed := querylayer.osi_parse(p_document);
    IF NOT (v_parsed->>'ok')::boolean THEN
        RAISE EXCEPTION 'the OSI document is invalid: %',
            (SELECT string_agg(e, '; ') FROM (SELECT e FROM jsonb_array_elements_text(v_parsed->'errors') e LIMIT 20) x)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.semantic_models (site_id, version, name, document, source_sha256, imported_by, connection_id)
    VALUES (p_site_id,
            coalesce((SELECT max(version) FROM querylayer.semantic_models WHERE site_id = p_site_id), 0) + 1,
            v_parsed->>'name', v_parsed->'model', encode(sha256(convert_to(p_document, 'UTF8')), 'hex'),
            p_imported_by, p_connection_id)
    RETURNING * INTO v;
    PERFORM querylayer.audit('semantics.import_model'::text, v.id::text, jsonb_build_object('name', v.name, 'version', v.version));
    RETURN jsonb_build_object('model_id', v.id, 'name', v.name, 'version', v.version, 'source_sha256', v.source_sha256,
        'datasets', jsonb_array_length(v.document->'semantic_model'->'datasets'),
        'metrics', jsonb_array_length(v.document->'semantic_model'->'metrics'), 'imported_at', v.imported_at);
END
$$;

-- -------------------------------------------------------------------------------------------
-- The callable surface (connection context). Reading the plane needs content:read; importing a
-- model needs content:write. Every decision made for the caller is a receipt.

-- Also POST /v1/models/import/osi, whose body is the document: under that route's envelope the
-- document must be the very body the sender signed.
CREATE FUNCTION querylayer_api.import_semantic_model(p_document text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection_for('querylayer_api.import_semantic_model'::text, 'content:write'::text);
    IF querylayer.signed_body_sha256() IS DISTINCT FROM NULL
       AND querylayer.signed_body_sha256() IS DISTINCT FROM encode(sha256(convert_to(coalesce(p_document, ''), 'UTF8')), 'hex') THEN
        RAISE EXCEPTION 'document: not the body the envelope of this request signed' USING ERRCODE = 'QL403';
    END IF;
    RETURN querylayer.store_semantic_model(querylayer.ctx_site_id(), p_document,
                                           'connection:' || querylayer.ctx_connection_id(), querylayer.ctx_connection_id());
END
$$;

CREATE FUNCTION querylayer_api.get_semantic_model() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v querylayer.semantic_models;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    v := querylayer.current_model();
    RETURN jsonb_build_object('model_id', v.id, 'name', v.name, 'version', v.version, 'imported_at', v.imported_at,
                              'document', v.document);
END
$$;

CREATE FUNCTION querylayer_api.search_semantic_model(p_text text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v querylayer.semantic_models;
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    IF p_text IS NULL OR length(p_text) NOT BETWEEN 1 AND 2000 THEN
        RAISE EXCEPTION 'text: 1 to 2000 characters are required' USING ERRCODE = '22023';
    END IF;
    v := querylayer.current_model();
    RETURN jsonb_build_object('model', v.name, 'version', v.version, 'text', p_text,
                              'matches', querylayer.model_search(v.document, p_text));
END
$$;

CREATE FUNCTION querylayer_api.resolve_metric(p_name text, p_dialect text DEFAULT 'SAIL_SQL') RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v querylayer.semantic_models;
    r jsonb;
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    v := querylayer.current_model();
    r := querylayer.model_resolve_metric(v.document, p_name, coalesce(p_dialect, 'SAIL_SQL'));
    IF r ? 'error' THEN
        RAISE EXCEPTION '%', r->>'error' USING ERRCODE = 'QL404';
    END IF;
    RETURN r;
END
$$;

-- RBAC AND ODRL for the calling agent on one resource; the decision is recorded as a receipt.
CREATE FUNCTION querylayer_api.check_access(p_resource text, p_action text DEFAULT 'read', p_purpose text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rights querylayer.rights_documents;
    v        jsonb;
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    v_rights := querylayer.current_rights();
    IF p_resource IS NULL OR length(p_resource) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'resource: 1 to 500 characters are required' USING ERRCODE = '22023';
    END IF;
    v := querylayer.rights_decide(querylayer.rights_or_empty(v_rights), querylayer.acting_principal(), p_resource,
                                  coalesce(p_action, 'read'), p_purpose, querylayer.utc_text(clock_timestamp()));
    PERFORM querylayer.record_receipts(jsonb_build_array(v->'receipt'), 'check_access'::text, p_purpose, NULL::uuid, v_rights.id);
    RETURN v;
END
$$;

CREATE FUNCTION querylayer_api.build_navigator_bundle(p_purpose text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_model  querylayer.semantic_models;
    v_rights querylayer.rights_documents;
    v        jsonb;
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    v_model := querylayer.current_model();
    v_rights := querylayer.current_rights();
    v := querylayer.model_bundle(v_model.document, querylayer.rights_or_empty(v_rights), querylayer.acting_principal(),
                                 p_purpose, querylayer.utc_text(clock_timestamp()));
    PERFORM querylayer.record_receipts(v->'receipts', 'bundle'::text, p_purpose, NULL::uuid, v_rights.id);
    RETURN v || jsonb_build_object('model_version', v_model.version);
END
$$;

-- The navigator loop, deterministic: search → gate → plan → synthesize → sign and record.
CREATE FUNCTION querylayer.answer(p_question text, p_purpose text, p_dialect text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_model  querylayer.semantic_models;
    v_rights querylayer.rights_documents;
BEGIN
    IF p_question IS NULL OR length(p_question) > 4000 THEN
        RAISE EXCEPTION 'question: at most 4000 characters are required' USING ERRCODE = '22023';
    END IF;
    v_model := querylayer.current_model();
    v_rights := querylayer.current_rights();
    RETURN querylayer.sign_and_record(
        querylayer.navigate_stored(v_model.id, v_rights.id, querylayer.acting_principal(),
                                   p_question, p_purpose, coalesce(p_dialect, 'SAIL_SQL'), querylayer.utc_text(clock_timestamp())),
        NULL::text, NULL::text, v_model, v_rights.id, p_purpose);
END
$$;

-- The same loop with an LLM on the edge: the database governs (search, gate, plan) and returns
-- the prompt — in which denied datasets appear by name as off-limits and no denied source
-- location appears at all — and signs whatever text comes back with complete_answer.
CREATE FUNCTION querylayer.prepare_answer(p_question text, p_purpose text, p_dialect text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_model  querylayer.semantic_models;
    v_rights querylayer.rights_documents;
    v_nav    jsonb;
    v_id     uuid;
BEGIN
    IF p_question IS NULL OR length(p_question) > 4000 THEN
        RAISE EXCEPTION 'question: at most 4000 characters are required' USING ERRCODE = '22023';
    END IF;
    v_model := querylayer.current_model();
    v_rights := querylayer.current_rights();
    v_nav := querylayer.navigate_stored(v_model.id, v_rights.id, querylayer.acting_principal(),
                                        p_question, p_purpose, coalesce(p_dialect, 'SAIL_SQL'), querylayer.utc_text(clock_timestamp()));
    INSERT INTO querylayer.answer_drafts (site_id, connection_id, purpose, navigation, model_id, rights_id)
    VALUES (querylayer.ctx_site_id(), querylayer.ctx_connection_id(), p_purpose, v_nav, v_model.id, v_rights.id)
    RETURNING id INTO v_id;
    RETURN jsonb_build_object('draft_id', v_id, 'prompt', v_nav->>'prompt', 'plans', jsonb_array_length(v_nav->'plans'));
END
$$;

-- The body of POST /v1/answer, read in the database from the exact bytes the envelope signed:
-- {"question", "purpose"?, "dialect"?}. Returns (question, purpose, dialect).
CREATE FUNCTION querylayer.signed_answer_request(p_body text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_body    jsonb;
    v_unknown text;
BEGIN
    IF p_body IS NULL OR querylayer.signed_body_sha256() IS DISTINCT FROM encode(sha256(convert_to(p_body, 'UTF8')), 'hex') THEN
        RAISE EXCEPTION 'body: not the body the envelope of this request signed' USING ERRCODE = 'QL403',
            HINT = 'run this only under the envelope of a POST /v1/answer request, with that request''s exact body';
    END IF;
    BEGIN
        v_body := p_body::jsonb;
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'body: not JSON' USING ERRCODE = '22023';
    END;
    IF jsonb_typeof(v_body) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'body: a JSON object {"question", "purpose"?, "dialect"?} is required' USING ERRCODE = '22023';
    END IF;
    SELECT k INTO v_unknown FROM jsonb_object_keys(v_body) k WHERE k NOT IN ('question', 'purpose', 'dialect') LIMIT 1;
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'body: unknown field %', quote_literal(left(v_unknown, 100)) USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v_body->'question') IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'question: a string is required' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v_body->'purpose') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION 'purpose: a string is required' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v_body->'dialect') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION 'dialect: a string is required' USING ERRCODE = '22023';
    END IF;
    RETURN ARRAY[v_body->>'question', v_body->>'purpose', v_body->>'dialect'];
END
$$;

CREATE FUNCTION querylayer_api.answer_question(p_question text, p_purpose text DEFAULT NULL, p_dialect text DEFAULT 'SAIL_SQL')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    RETURN querylayer.answer(p_question, p_purpose, p_dialect);
END
$$;

CREATE FUNCTION querylayer_api.prepare_answer(p_question text, p_purpose text DEFAULT NULL, p_dialect text DEFAULT 'SAIL_SQL')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    RETURN querylayer.prepare_answer(p_question, p_purpose, p_dialect);
END
$$;

-- POST /v1/answer: the question is read from the signed body itself, so what runs is what the
-- sender signed, whatever the edge would pass.
CREATE FUNCTION querylayer_api.answer_signed_request(p_body text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v text[];
BEGIN
    PERFORM querylayer.require_connection_for('querylayer_api.answer_signed_request'::text, 'content:read'::text);
    v := querylayer.signed_answer_request(p_body);
    RETURN querylayer.answer(v[1], v[2], coalesce(v[3], 'SAIL_SQL'));
END
$$;

CREATE FUNCTION querylayer_api.prepare_signed_answer(p_body text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v text[];
BEGIN
    PERFORM querylayer.require_connection_for('querylayer_api.prepare_signed_answer'::text, 'content:read'::text);
    v := querylayer.signed_answer_request(p_body);
    RETURN querylayer.prepare_answer(v[1], v[2], coalesce(v[3], 'SAIL_SQL'));
END
$$;

CREATE FUNCTION querylayer_api.complete_answer(p_draft_id uuid, p_text text, p_synthesized_by text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_draft querylayer.answer_drafts;
    v_model querylayer.semantic_models;
BEGIN
    PERFORM querylayer.require_connection_for('querylayer_api.complete_answer'::text, 'content:read'::text);
    SELECT * INTO v_draft FROM querylayer.answer_drafts WHERE id = p_draft_id FOR UPDATE;
    IF NOT FOUND OR v_draft.connection_id <> querylayer.ctx_connection_id() THEN
        RAISE EXCEPTION 'no answer draft % for this connection', p_draft_id USING ERRCODE = 'QL404';
    END IF;
    IF v_draft.completed_at IS NOT NULL THEN
        RAISE EXCEPTION 'answer draft % is already completed', p_draft_id USING ERRCODE = 'QL409';
    END IF;
    IF p_text IS NULL OR length(p_text) NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'text: the synthesized answer is required' USING ERRCODE = '22023';
    END IF;
    UPDATE querylayer.answer_drafts SET completed_at = now() WHERE id = v_draft.id;
    SELECT * INTO v_model FROM querylayer.semantic_models WHERE id = v_draft.model_id;
    RETURN querylayer.sign_and_record(v_draft.navigation, p_text, coalesce(p_synthesized_by, 'llm'), v_model,
                                      v_draft.rights_id, v_draft.purpose);
END
$$;

-- The resilience-desk story: every specialist is a registered agent (by principal) gated by the
-- site's rights; each gets a receipt, a COMPLETE OpenLineage event and an attestation.
CREATE FUNCTION querylayer_api.run_qglake_story() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_key     querylayer.server_keys;
    v_rights  querylayer.rights_documents;
    v_missing text;
    v_run     jsonb;
    r         jsonb;
    i         integer := 0;
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    v_key := querylayer.server_key();
    SELECT s->>'principal' INTO v_missing
      FROM jsonb_array_elements(querylayer.story_roster()->'specialists') s
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.agents a
                        WHERE a.organization_id = querylayer.ctx_organization_id() AND a.principal = s->>'principal')
     LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'the story''s specialist % is not a registered agent of this organization', v_missing
            USING ERRCODE = 'QL404', HINT = 'querylayer admin seed-demo registers the roster';
    END IF;
    SELECT * INTO v_rights FROM querylayer.rights_documents
     WHERE site_id = querylayer.ctx_site_id() AND document->'odrl'->>'uid' = 'urn:querylayer:policy:resilience-desk-story'
     ORDER BY version DESC LIMIT 1;
    IF v_rights.id IS NULL THEN
        -- No rights the site's operator loaded: nothing is decided under rights nobody chose.
        RAISE EXCEPTION 'this site has no rights for the story (policy urn:querylayer:policy:resilience-desk-story)'
            USING ERRCODE = 'QL404', HINT = 'querylayer admin seed-demo loads them on the demo site; import_rights elsewhere';
    END IF;
    v_run := querylayer.run_story(v_rights.document, v_key.secret, querylayer.utc_text(clock_timestamp()));
    FOR r IN SELECT * FROM jsonb_array_elements(v_run->'responses') LOOP
        PERFORM querylayer.record_receipts(jsonb_build_array(r->'receipt'), 'story'::text, v_run->'prompt'->>'purpose', NULL::uuid, v_rights.id);
        PERFORM querylayer.record_event(v_run->'openlineage_texts'->>i, r->'attestation', NULL::uuid, r->>'agent', v_key.id);
        i := i + 1;
    END LOOP;
    PERFORM querylayer.audit('semantics.story'::text, NULL::text, jsonb_build_object('specialists', i));
    RETURN v_run - 'openlineage_texts' || jsonb_build_object('server_did', v_key.did_key);
END
$$;

-- The story's roster and what its recorded runs said (read-only: reading it runs nothing).
CREATE FUNCTION querylayer_api.story_overview() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection('content:read'::text);
    RETURN jsonb_build_object(
        'roster', querylayer.story_roster(),
        'recorded_runs', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                              'agent', e.story_agent, 'run_id', e.run_id, 'event_sha256', e.event_sha256,
                              'created_at', e.created_at) ORDER BY e.chain_seq DESC, e.created_at DESC), '[]')
                            FROM (SELECT * FROM querylayer.lineage_events
                                   WHERE site_id = querylayer.ctx_site_id() AND story_agent IS NOT NULL
                                   ORDER BY chain_seq DESC, created_at DESC LIMIT 60) e),
        'receipts', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                         'principal', r.principal, 'resource', r.resource, 'allowed', r.allowed, 'reason', r.reason,
                         'issued_at', r.issued_at) ORDER BY r.chain_seq DESC, r.issued_at DESC), '[]')
                       FROM (SELECT * FROM querylayer.access_receipts
                              WHERE site_id = querylayer.ctx_site_id() AND decided_for = 'story'
                              ORDER BY chain_seq DESC, issued_at DESC LIMIT 60) r));
END
$$;

-- The public key material: the current did:key and every earlier one (for verifying older
-- attestations). Callable without a context: these are public.
CREATE FUNCTION querylayer_api.server_keys() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN jsonb_build_object(
        'current', (SELECT did_key FROM querylayer.server_keys WHERE retired_at IS NULL),
        'envelope_recipient', (SELECT value #>> '{}' FROM querylayer.settings WHERE key = 'server_did'),
        'keys', (SELECT jsonb_agg(jsonb_build_object('did_key', did_key, 'created_at', created_at, 'retired_at', retired_at)
                                  ORDER BY created_at) FROM querylayer.server_keys));
END
$$;

-- Every stored lineage event with its attestation, for auditors and tests (connection context).
CREATE FUNCTION querylayer_api.list_lineage(p_answer_id uuid DEFAULT NULL, p_limit integer DEFAULT 50) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_principal('runs:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'lineage_event_id', e.id, 'answer_id', e.answer_id, 'story_agent', e.story_agent, 'run_id', e.run_id,
                'event_text', e.event::text, 'event_sha256', e.event_sha256, 'attestation', a.attestation,
                'server_did', k.did_key, 'created_at', e.created_at) ORDER BY e.chain_seq, e.created_at), '[]')
              FROM (SELECT * FROM querylayer.lineage_events WHERE site_id = querylayer.ctx_site_id()
                      AND (p_answer_id IS NULL OR answer_id = p_answer_id) ORDER BY chain_seq DESC, created_at DESC LIMIT p_limit) e
              JOIN querylayer.attestations a ON a.lineage_event_id = e.id
              JOIN querylayer.server_keys k ON k.id = a.server_key_id);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.import_semantic_model, querylayer_api.get_semantic_model,
    querylayer_api.search_semantic_model, querylayer_api.resolve_metric, querylayer_api.check_access,
    querylayer_api.build_navigator_bundle, querylayer_api.answer_question, querylayer_api.prepare_answer,
    querylayer_api.answer_signed_request, querylayer_api.prepare_signed_answer,
    querylayer_api.complete_answer, querylayer_api.run_qglake_story, querylayer_api.story_overview, querylayer_api.server_keys,
    querylayer_api.list_lineage TO querylayer_edge;

-- -------------------------------------------------------------------------------------------
-- Operators.

CREATE FUNCTION querylayer_api.import_rights(p_site text, p_document text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site   querylayer.sites;
    v_parsed jsonb := querylayer.rights_parse(p_document);
    v        querylayer.rights_documents;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    IF v_parsed->'document' = 'null'::jsonb THEN
        RAISE EXCEPTION 'the rights document is not JSON: %', v_parsed->'problems'->>0 USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.rights_documents (site_id, version, document, problems, imported_by)
    VALUES (v_site.id, coalesce((SELECT max(version) FROM querylayer.rights_documents WHERE site_id = v_site.id), 0) + 1,
            v_parsed->'document', v_parsed->'problems', 'operator:' || querylayer.outer_user())
    RETURNING * INTO v;
    PERFORM querylayer.audit('semantics.import_rights'::text, v.id::text, jsonb_build_object('version', v.version,
        'problems', jsonb_array_length(v.problems)));
    -- A document with problems is stored (for the record) but makes every decision deny.
    RETURN jsonb_build_object('rights_id', v.id, 'site', v_site.slug, 'version', v.version, 'problems', v.problems);
END
$$;

CREATE FUNCTION querylayer_api.import_semantic_model_as_operator(p_site text, p_document text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN querylayer.store_semantic_model(v_site.id, p_document, 'operator:' || querylayer.outer_user(), NULL::uuid)
        || jsonb_build_object('site', v_site.slug);
END
$$;

-- Rotates the server key: the current key retires (earlier attestations stay verifiable
-- against it) and a new one is generated here.
CREATE FUNCTION querylayer_api.rotate_server_key() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    UPDATE querylayer.server_keys SET retired_at = clock_timestamp() WHERE retired_at IS NULL;
    INSERT INTO querylayer.server_keys (did_key, secret, origin)
    SELECT querylayer.key_did(s), s, 'generated' FROM (SELECT querylayer.new_key_secret() AS s) k;
    PERFORM querylayer.audit('server_key.rotate'::text, NULL::text, jsonb_build_object('did_key', (querylayer.server_key()).did_key));
    RETURN querylayer_api.server_keys();
END
$$;

-- Installs an operator-supplied key (32-byte Ed25519 secret, hex). The secret travels as a
-- statement parameter: run it with statement logging off.
CREATE FUNCTION querylayer_api.set_server_key(p_secret_hex text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_secret bytea;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF p_secret_hex IS NULL OR p_secret_hex !~ '^[0-9a-fA-F]{64}$' THEN
        RAISE EXCEPTION 'secret: 64 hex characters (a 32-byte Ed25519 secret) are required' USING ERRCODE = '22023';
    END IF;
    v_secret := decode(p_secret_hex, 'hex');
    UPDATE querylayer.server_keys SET retired_at = clock_timestamp() WHERE retired_at IS NULL;
    INSERT INTO querylayer.server_keys (did_key, secret, origin) VALUES (querylayer.key_did(v_secret), v_secret, 'operator');
    PERFORM querylayer.audit('server_key.set'::text, NULL::text, jsonb_build_object('did_key', (querylayer.server_key()).did_key));
    RETURN querylayer_api.server_keys();
END
$$;

-- The demo's semantics: the resilience-desk model and rights, the story's rights, and the
-- story roster registered as agents (by their rights principals). Idempotent.
CREATE FUNCTION querylayer.seed_demo_semantics(p_site_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_docs jsonb := querylayer.demo_documents();
    s      jsonb;
    v_org  uuid;
BEGIN
    PERFORM querylayer.enter_operator(p_site_id);
    SELECT organization_id INTO v_org FROM querylayer.sites WHERE id = p_site_id;
    IF NOT EXISTS (SELECT 1 FROM querylayer.semantic_models WHERE site_id = p_site_id) THEN
        PERFORM querylayer_api.import_semantic_model_as_operator('demo'::text, v_docs->>'model');
        PERFORM querylayer_api.import_rights('demo'::text, v_docs->>'story_rights');
        PERFORM querylayer_api.import_rights('demo'::text, v_docs->>'rights');
    END IF;
    FOR s IN SELECT * FROM jsonb_array_elements(querylayer.story_roster()->'specialists') LOOP
        IF NOT EXISTS (SELECT 1 FROM querylayer.agents WHERE organization_id = v_org AND principal = s->>'principal') THEN
            PERFORM querylayer_api.create_agent('demo'::text, lower(regexp_replace(s->>'name', '([a-z])([A-Z])', '\1-\2', 'g')),
                                                'generic'::text, NULL::text, NULL::text, s->>'principal');
        END IF;
    END LOOP;
END
$$;
