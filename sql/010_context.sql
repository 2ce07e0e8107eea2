-- Guards over the request context. The context itself lives in the extension's backend memory
-- (see extension/src/context.rs); these helpers turn "who is acting" into refusals with stable
-- SQLSTATEs (docs/errors.md) at the top of every governed function.

-- The scopes of the beta contract. A connection's scopes and an agent's site permissions are
-- drawn from this list.
CREATE TABLE querylayer.scopes (
    scope       text PRIMARY KEY,
    description text NOT NULL
);
INSERT INTO querylayer.scopes (scope, description) VALUES
    ('site:read',         'read the site context and aggregate site metrics'),
    ('content:read',      'read content items, revisions, evidence and briefs'),
    ('content:write',     'create drafts, stage source packages and record evidence'),
    ('topical-map:read',  'read the topical map and imported strategy opportunities'),
    ('topical-map:write', 'propose topical map changes'),
    ('runs:read',         'read governed runs, their events and artifacts'),
    ('runs:write',        'begin, record and finish governed runs'),
    ('publish:request',   'request publishing, unpublishing, archiving and restoring through human approval');

-- What a connection's verdict is decided from (sql/040_credentials.sql's connections, its agent's
-- site permissions, its budgets, its did:key bindings, and the names of its site, organization
-- and agent) changes only together with the liveness generation: every statement that writes
-- one of those tables (decides_liveness) moves it, in its own transaction, to a number drawn from
-- a sequence, so never to a number used before, not even by a transaction that rolled back.
-- authenticate keeps the verdict it reached on a live connection in the backend's memory with
-- the generation it read before reaching it, and takes it up again only while the newest
-- committed generation is still that number and the credential has not expired
-- (extension/src/context.rs, "Kept verdicts"): a verdict is never used once anything it was
-- decided from has changed. The table is empty until the first change.
CREATE SEQUENCE querylayer.liveness_generations AS bigint;
CREATE TABLE querylayer.liveness_generation (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    generation bigint NOT NULL
);
ALTER SEQUENCE querylayer.liveness_generations OWNED BY querylayer.liveness_generation.generation;

CREATE FUNCTION querylayer.next_liveness_generation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO querylayer.liveness_generation AS g (one, generation)
    VALUES (true, nextval('querylayer.liveness_generations'))
    ON CONFLICT (one) DO UPDATE SET generation = nextval('querylayer.liveness_generations');
    RETURN NULL;
END
$$;

-- Makes every statement that writes p_table (TRUNCATE included, and in replica mode too) move
-- the liveness generation.
CREATE FUNCTION querylayer.decides_liveness(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER zz_liveness_generation AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s
                    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.next_liveness_generation()', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER zz_liveness_generation', p_table);
END
$$;

-- Requires an authenticated agent connection holding p_scope (NULL: any connection). A context
-- made by an envelope (authenticate_envelope) is bound to the one request its sender signed: it
-- runs only the functions mapped to that route (querylayer.envelope_routes), so p_function names
-- the function asking, and NULL (require_connection) admits no envelope context at all.
-- ctx_connection_holds (extension/src/context.rs) is the fast path of this rule: true when it
-- passes with nothing to do (a live connection, no envelope, the scope held, no budget to spend);
-- otherwise the checks below run, and only they raise.
CREATE FUNCTION querylayer.require_connection_for(p_function text, p_scope text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_route jsonb;
BEGIN
    IF querylayer.ctx_connection_holds(p_scope) THEN
        RETURN;
    END IF;
    IF querylayer.ctx_kind() IS DISTINCT FROM 'connection' THEN
        RAISE EXCEPTION 'no authenticated connection in this transaction'
            USING ERRCODE = 'QL401',
                  HINT = 'call querylayer_api.authenticate(fingerprint) first, in the same transaction';
    END IF;
    v_route := querylayer.ctx_envelope_route();
    IF v_route IS NOT NULL AND (p_function IS NULL OR NOT EXISTS (
        SELECT 1 FROM querylayer.envelope_routes r
         WHERE r.method = v_route->>'method' AND r.path = v_route->>'path' AND r.function_name = p_function)) THEN
        RAISE EXCEPTION 'this transaction acts through an envelope signed for % %; %',
            v_route->>'method', v_route->>'path',
            coalesce(p_function || ' does not serve that route', 'nothing else runs under it')
            USING ERRCODE = 'QL403',
                  HINT = 'an envelope authorizes the one request it signs; send each request with its own envelope';
    END IF;
    IF p_scope IS NOT NULL AND NOT (p_scope = ANY (querylayer.ctx_scopes())) THEN
        -- DETAIL names the scope for the edge: an OAuth client is answered with the step-up
        -- challenge for it (docs/security.md, "OAuth").
        RAISE EXCEPTION 'this connection does not hold the scope %', p_scope
            USING ERRCODE = 'QL403', DETAIL = 'required_scope=' || p_scope,
                  HINT = 'an operator can grant the scope to the agent on this site and issue a connection that carries it';
    END IF;
    IF p_scope IS NOT NULL AND querylayer.ctx_has_budgets() THEN
        PERFORM querylayer.spend_budgets(p_scope);  -- sql/157_rate.sql
    END IF;
END
$$;

-- (plpgsql, not sql: the planner does not inline this call, and an sql function that is not
-- inlined is parsed and planned again at every call, which every governed function paid. The
-- fast path here, not only in require_connection_for, saves a call a level deep at the top of
-- every governed function: 6 % of a tool call's statement, docs/performance.md.)
CREATE FUNCTION querylayer.require_connection(p_scope text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT querylayer.ctx_connection_holds(p_scope) THEN
        PERFORM querylayer.require_connection_for(NULL::text, p_scope);
    END IF;
END
$$;

-- The SHA-256 (hex) of the body an envelope-derived context was signed for, or NULL.
CREATE FUNCTION querylayer.signed_body_sha256() RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN querylayer.ctx_envelope_route()->>'body_sha256';
END
$$;

-- Requires an authenticated member whose role on the context's site is one of p_roles.
CREATE FUNCTION querylayer.require_member(p_roles text[] DEFAULT NULL) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF querylayer.ctx_kind() IS DISTINCT FROM 'member' THEN
        RAISE EXCEPTION 'no authenticated member in this transaction'
            USING ERRCODE = 'QL401',
                  HINT = 'call querylayer_api.authenticate_member(fingerprint) first, in the same transaction';
    END IF;
    IF p_roles IS NOT NULL AND NOT (querylayer.ctx_member_role() = ANY (p_roles)) THEN
        RAISE EXCEPTION 'a member with role % may not do this (requires one of: %)',
            querylayer.ctx_member_role(), array_to_string(p_roles, ', ')
            USING ERRCODE = 'QL403';
    END IF;
END
$$;

-- Requires a connection or a member (reads shared by agents and the console).
CREATE FUNCTION querylayer.require_principal(p_scope text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF querylayer.ctx_kind() = 'member' THEN
        RETURN;
    END IF;
    PERFORM querylayer.require_connection(p_scope);
END
$$;

-- Refuses the call when the context is missing or not the operator's.
CREATE FUNCTION querylayer.require_operator() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT querylayer.ctx_is_operator() THEN
        RAISE EXCEPTION 'operator context required' USING ERRCODE = 'QL401';
    END IF;
END
$$;

-- Validates a scope list against the catalogue; returns it sorted and de-duplicated.
CREATE FUNCTION querylayer.normalize_scopes(p_scopes text[]) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_unknown text[];
BEGIN
    IF p_scopes IS NULL OR cardinality(p_scopes) = 0 THEN
        RAISE EXCEPTION 'at least one scope is required' USING ERRCODE = '22023',
            HINT = (SELECT 'known scopes: ' || string_agg(scope, ', ' ORDER BY scope) FROM querylayer.scopes);
    END IF;
    SELECT array_agg(s ORDER BY s) INTO v_unknown
      FROM unnest(p_scopes) AS s
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.scopes c WHERE c.scope = s);
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown scope(s): %', array_to_string(v_unknown, ', ') USING ERRCODE = '22023',
            HINT = (SELECT 'known scopes: ' || string_agg(scope, ', ' ORDER BY scope) FROM querylayer.scopes);
    END IF;
    RETURN ARRAY(SELECT DISTINCT s FROM unnest(p_scopes) AS s ORDER BY s);
END
$$;

-- Row-level security, keyed on the context. Site-owned tables see only the context's site;
-- organization-owned identity tables see the context's organization (operators see all).
CREATE FUNCTION querylayer.isolate_by_site(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p_table);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', p_table);
    EXECUTE format('CREATE POLICY site_isolation ON %s
                    USING (site_id = querylayer.ctx_site_id())
                    WITH CHECK (site_id = querylayer.ctx_site_id())', p_table);
END
$$;

CREATE FUNCTION querylayer.isolate_by_organization(p_table regclass, p_column name DEFAULT 'organization_id') RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p_table);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', p_table);
    EXECUTE format('CREATE POLICY organization_isolation ON %s
                    USING (querylayer.ctx_is_operator() OR %I = querylayer.ctx_organization_id())
                    WITH CHECK (querylayer.ctx_is_operator() OR %I = querylayer.ctx_organization_id())',
                   p_table, p_column, p_column);
END
$$;

-- Paging. Every list of the surface takes a limit and an opaque cursor and answers one page and
-- `next_cursor` (NULL on the last page). A cursor holds the keyset position of the page's last
-- row — its sort key and id, never an offset — so rows inserted meanwhile neither repeat nor
-- shift the rows of a later page. A cursor names its list; another list refuses it.
CREATE FUNCTION querylayer.page_limit(p_limit integer, p_max integer DEFAULT 500) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND p_max THEN
        RAISE EXCEPTION 'limit must be between 1 and %', p_max USING ERRCODE = '22023';
    END IF;
    RETURN p_limit;
END
$$;

CREATE FUNCTION querylayer.page_cursor(p_list text, p_key text, p_id uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN pg_catalog.translate(pg_catalog.encode(pg_catalog.convert_to(
               pg_catalog.jsonb_build_array(p_list, p_key, p_id)::text, 'UTF8'), 'base64'), E'+/=\n', '-_');
END
$$;

-- The position a cursor of p_list names: the sort key (as text) and the id of the last row seen.
-- Both NULL without a cursor.
CREATE FUNCTION querylayer.page_after(p_list text, p_cursor text, OUT after_key text, OUT after_id uuid)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v jsonb;
BEGIN
    IF p_cursor IS NULL THEN
        RETURN;
    END IF;
    BEGIN
        v := pg_catalog.convert_from(pg_catalog.decode(
                 pg_catalog.rpad(pg_catalog.translate(p_cursor, '-_', '+/'), (length(p_cursor) + 3) / 4 * 4, '='),
                 'base64'), 'UTF8')::jsonb;
        IF jsonb_typeof(v) = 'array' AND jsonb_array_length(v) = 3 AND v->>0 = p_list THEN
            after_key := v->>1;
            after_id := (v->>2)::uuid;
        END IF;
    EXCEPTION WHEN others THEN
        after_id := NULL;
    END;
    IF after_id IS NULL OR after_key IS NULL THEN
        RAISE EXCEPTION 'cursor: not a cursor of this list' USING ERRCODE = '22023',
            HINT = 'pass the next_cursor of the previous page unchanged';
    END IF;
END
$$;

-- One page: p_rows holds the first p_limit + 1 rows in list order, each {item, key, id}; the
-- answer is {<p_name>: the first p_limit items, next_cursor}.
CREATE FUNCTION querylayer.page(p_list text, p_name text, p_limit integer, p_rows jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN pg_catalog.jsonb_build_object(
        p_name, coalesce((SELECT pg_catalog.jsonb_agg(r.value->'item' ORDER BY r.o)
                            FROM pg_catalog.jsonb_array_elements(coalesce(p_rows, '[]')) WITH ORDINALITY AS r(value, o)
                           WHERE r.o <= p_limit), '[]'),
        'next_cursor', querylayer.next_cursor(p_list, p_limit, pg_catalog.jsonb_array_length(coalesce(p_rows, '[]')),
                                              p_rows->(p_limit - 1)->>'key', (p_rows->(p_limit - 1)->>'id')::uuid));
END
$$;

-- The next page's cursor of a page read as p_rows rows of at most p_limit + 1, whose p_limit-th
-- row has the sort key p_key and the id p_id; NULL on the last page.
CREATE FUNCTION querylayer.next_cursor(p_list text, p_limit integer, p_rows integer, p_key text, p_id uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE WHEN p_rows > p_limit THEN querylayer.page_cursor(p_list, p_key, p_id) END;
END
$$;

-- A timestamp as a sort key: ISO 8601 with microseconds, whatever the session's DateStyle.
CREATE FUNCTION querylayer.page_key(p_at timestamptz) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN pg_catalog.to_jsonb(p_at) #>> '{}';
END
$$;
