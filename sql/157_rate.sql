-- Token buckets decided in the database, so that a limit holds across every edge instance that
-- shares it: one row per (kind, key), refilled at the caller's rate up to its burst, a token
-- taken by the statement that does the work. The edges pass the rates they were started with
-- (`querylayer serve --rate-limit`, `--auth-failure-rate`, …); edges started alike share one
-- exact limit. Kinds: 'connection' (a connection's requests, keyed by its id), 'auth_failure'
-- (the failed authentications of a peer address), 'oauth_register' (dynamic client
-- registrations of a peer address).
--
-- UNLOGGED: a bucket is not history and costs no WAL; a crash empties the table, which refills
-- every bucket (the limits start over, nothing is admitted that the rates would not admit
-- afterwards). A standby has none: limits are decided on the primary.

CREATE UNLOGGED TABLE querylayer.rate_buckets (
    kind   text NOT NULL CHECK (kind IN ('connection', 'auth_failure', 'oauth_register')),
    key    text NOT NULL CHECK (length(key) <= 64),
    tokens double precision NOT NULL,
    at     timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);

-- Takes one token of bucket (p_kind, p_key) that refills at p_per_sec up to p_burst: 0 when it
-- was there, otherwise the seconds until one will be (nothing taken). A rate of 0 or less (or
-- NULL) admits everything and keeps no bucket. Within one statement's transaction the bucket's
-- row stays locked, so two edges taking the same connection's tokens queue for each other.
CREATE FUNCTION querylayer.take_token(p_kind text, p_key text, p_per_sec double precision, p_burst double precision)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_burst  double precision := greatest(coalesce(p_burst, 1), 1);
    v_now    timestamptz := clock_timestamp();
    v_tokens double precision;
BEGIN
    IF coalesce(p_per_sec, 0) <= 0 OR p_key IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO querylayer.rate_buckets AS b (kind, key, tokens, at)
    VALUES (p_kind, p_key, v_burst - 1, v_now)
    ON CONFLICT (kind, key) DO UPDATE
       SET tokens = least(v_burst, b.tokens + extract(epoch FROM v_now - b.at) * p_per_sec) - 1, at = v_now
     WHERE least(v_burst, b.tokens + extract(epoch FROM v_now - b.at) * p_per_sec) >= 1
    RETURNING b.tokens INTO v_tokens;
    IF FOUND THEN
        RETURN 0;
    END IF;
    SELECT least(v_burst, b.tokens + extract(epoch FROM v_now - b.at) * p_per_sec) INTO v_tokens
      FROM querylayer.rate_buckets b WHERE b.kind = p_kind AND b.key = p_key;
    RETURN greatest(1, ceil((1 - v_tokens) / p_per_sec))::integer;
END
$$;

-- Whether bucket (p_kind, p_key) has a token now, without taking it: 0, or the seconds until it
-- will. For budgets that are spent by failures only (a peer's failed authentications): asked
-- before the work, spent (take_token) when the work fails.
CREATE FUNCTION querylayer.token_wait(p_kind text, p_key text, p_per_sec double precision, p_burst double precision)
RETURNS integer
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tokens double precision;
BEGIN
    IF coalesce(p_per_sec, 0) <= 0 OR p_key IS NULL THEN
        RETURN 0;
    END IF;
    SELECT least(greatest(coalesce(p_burst, 1), 1), b.tokens + extract(epoch FROM clock_timestamp() - b.at) * p_per_sec)
      INTO v_tokens FROM querylayer.rate_buckets b WHERE b.kind = p_kind AND b.key = p_key;
    IF NOT FOUND OR v_tokens >= 1 THEN
        RETURN 0;
    END IF;
    RETURN greatest(1, ceil((1 - v_tokens) / p_per_sec))::integer;
END
$$;

-- Refuses with QL429 (rate_limited) when p_wait says to wait. DETAIL is `retry_after=<seconds>
-- of=<what>` (what: connection, peer, registration), for the edge's Retry-After and for the
-- refusals it then repeats without asking until the time is up.
CREATE FUNCTION querylayer.refuse_rate(p_wait integer, p_what text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(p_wait, 0) > 0 THEN
        RAISE EXCEPTION '%: over the rate; retry in % s',
            CASE p_what WHEN 'connection' THEN 'this connection' WHEN 'peer' THEN 'this address''s failed authentications'
                        ELSE 'client registrations from this address' END, p_wait
            USING ERRCODE = 'QL429', DETAIL = 'retry_after=' || p_wait || ' of=' || p_what,
                  HINT = 'wait ' || p_wait || ' s, then retry (a write with the same idempotency key)';
    END IF;
END
$$;

-- The failed-authentication budget of a peer address, as the edges decide it: whether the peer
-- may present a credential now (0, or the seconds to wait), and spending one failure. The edge
-- sends its address with every credential it has not seen live lately (authenticate_from) and
-- spends the budget in the statement that records a failure, so edges started alike share one
-- budget per address.
CREATE FUNCTION querylayer_api.peer_failure_wait(p_peer text, p_rate double precision, p_burst double precision)
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN querylayer.token_wait('auth_failure'::text, left(p_peer, 64), p_rate, p_burst);
END
$$;

CREATE FUNCTION querylayer_api.spend_peer_failure(p_peer text, p_rate double precision, p_burst double precision)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.take_token('auth_failure'::text, left(p_peer, 64), p_rate, p_burst);
    RETURN querylayer.token_wait('auth_failure'::text, left(p_peer, 64), p_rate, p_burst);
END
$$;

-- authenticate as the edge sends it for a credential it has not seen live lately: refused with
-- QL429 (rate_limited) while p_peer's failed-authentication budget is spent, whatever the
-- credential; then, for a live connection, one token of its bucket (p_rate a second, p_burst at
-- once; QL429 when there is none). Returns what authenticate returns.
CREATE FUNCTION querylayer_api.authenticate_edge(p_fingerprint bytea, p_peer text,
                                                 p_failure_rate double precision, p_failure_burst double precision,
                                                 p_rate double precision, p_burst double precision) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v jsonb;
BEGIN
    PERFORM querylayer.refuse_rate(querylayer.token_wait('auth_failure'::text, left(p_peer, 64), p_failure_rate,
                                                         p_failure_burst), 'peer'::text);
    v := querylayer_api.authenticate(p_fingerprint);
    PERFORM querylayer.refuse_rate(querylayer.take_token('connection'::text, querylayer.ctx_connection_id()::text,
                                                         p_rate, p_burst), 'connection'::text);
    RETURN v;
END
$$;

-- One token of the authenticated connection's bucket, or QL429: for a request that
-- authenticated otherwise (a /v1 envelope).
CREATE FUNCTION querylayer_api.take_connection_token(p_rate double precision, p_burst double precision) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Any connection context, an envelope's too (it only limits, it grants nothing).
    IF querylayer.ctx_kind() IS DISTINCT FROM 'connection' THEN
        RAISE EXCEPTION 'no authenticated connection in this transaction' USING ERRCODE = 'QL401';
    END IF;
    PERFORM querylayer.refuse_rate(querylayer.take_token('connection'::text, querylayer.ctx_connection_id()::text,
                                                         p_rate, p_burst), 'connection'::text);
END
$$;

-- -------------------------------------------------------------------------------------------
-- Budgets of a connection, set by operators and by the site's owners and admins: at most
-- max_calls calls in each hour or day (a window from the hour's or day's start, UTC) among the
-- calls that need `scope`, or with scope '*write' every call that needs a write scope
-- (content:write, topical-map:write, runs:write, publish:request). Spent where the scope is
-- checked (require_connection_for, every governed function), so no path around the budget
-- exists; a refused call spends nothing (its statement rolls back, the use with it).

CREATE TABLE querylayer.connection_budgets (
    connection_id uuid NOT NULL REFERENCES querylayer.connections ON DELETE RESTRICT,
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    scope         text NOT NULL CHECK (scope = '*write' OR scope ~ '^[a-z-]+:[a-z]+$'),
    period        text NOT NULL CHECK (period IN ('hour', 'day')),
    max_calls     integer NOT NULL CHECK (max_calls BETWEEN 0 AND 100000000),
    set_by        text NOT NULL,
    set_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, scope, period)
);
SELECT querylayer.isolate_by_site('querylayer.connection_budgets'::regclass);
SELECT querylayer.decides_liveness('querylayer.connection_budgets'::regclass);

CREATE TABLE querylayer.connection_budget_use (
    connection_id uuid NOT NULL,
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    scope         text NOT NULL,
    period        text NOT NULL,
    window_start  timestamptz NOT NULL,
    used          integer NOT NULL DEFAULT 0,
    PRIMARY KEY (connection_id, scope, period, window_start)
);
ALTER TABLE querylayer.connection_budget_use ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.connection_budget_use FORCE ROW LEVEL SECURITY;
-- A site's calls spend its connections' budgets; operators (retention) remove the windows past.
CREATE POLICY site_isolation ON querylayer.connection_budget_use
    USING (site_id = querylayer.ctx_site_id() OR querylayer.ctx_is_operator())
    WITH CHECK (site_id = querylayer.ctx_site_id());

-- What retention removes of the limits: windows of budgets that ended more than a day ago, and
-- buckets untouched for a day (full again by then: the same as none). Returns how many rows.
CREATE FUNCTION querylayer.reclaim_limits() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_windows bigint;
    v_buckets bigint;
BEGIN
    DELETE FROM querylayer.connection_budget_use WHERE window_start < pg_catalog.now() - interval '2 days';
    GET DIAGNOSTICS v_windows = ROW_COUNT;
    DELETE FROM querylayer.rate_buckets WHERE at < pg_catalog.now() - interval '1 day';
    GET DIAGNOSTICS v_buckets = ROW_COUNT;
    RETURN v_windows + v_buckets;
END
$$;

CREATE FUNCTION querylayer.is_write_scope(p_scope text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_scope LIKE '%:write' OR p_scope = 'publish:request';
END
$$;

-- Spends one call of every budget of the context's connection that p_scope falls under, or
-- refuses with QL429 (retry_after: the seconds to the window's end). Called by
-- require_connection_for only when the connection has budgets (ctx_has_budgets).
CREATE FUNCTION querylayer.spend_budgets(p_scope text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b       record;
    v_start timestamptz;
    v_used  integer;
BEGIN
    FOR b IN SELECT * FROM querylayer.connection_budgets
              WHERE connection_id = querylayer.ctx_connection_id()
                AND (scope = p_scope OR (scope = '*write' AND querylayer.is_write_scope(p_scope)))
              ORDER BY scope, period LOOP
        v_start := date_trunc(b.period, pg_catalog.now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
        INSERT INTO querylayer.connection_budget_use AS u (connection_id, site_id, scope, period, window_start, used)
        VALUES (b.connection_id, b.site_id, b.scope, b.period, v_start, 1)
        ON CONFLICT (connection_id, scope, period, window_start) DO UPDATE SET used = u.used + 1
        RETURNING u.used INTO v_used;
        IF v_used > b.max_calls THEN
            RAISE EXCEPTION 'this connection''s budget of % calls per % % is used up', b.max_calls, b.period,
                CASE WHEN b.scope = '*write' THEN 'that write' ELSE 'that need ' || b.scope END
                USING ERRCODE = 'QL429',
                      DETAIL = 'retry_after=' || greatest(1, ceil(extract(epoch FROM v_start + ('1 ' || b.period)::interval - pg_catalog.now())))::integer,
                      HINT = 'the budget starts again with the next ' || b.period || '; an owner or operator sets budgets';
        END IF;
    END LOOP;
END
$$;

-- A connection's budgets with what the current windows used: [{scope, period, max_calls, used,
-- resets_at}].
CREATE FUNCTION querylayer.budgets_json(p_connection uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'scope', b.scope, 'period', b.period, 'max_calls', b.max_calls,
                   'used', coalesce(u.used, 0),
                   'resets_at', (date_trunc(b.period, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') + ('1 ' || b.period)::interval)
                 ORDER BY b.scope, b.period), '[]'::jsonb)
          FROM querylayer.connection_budgets b
          LEFT JOIN querylayer.connection_budget_use u
            ON u.connection_id = b.connection_id AND u.scope = b.scope AND u.period = b.period
           AND u.window_start = date_trunc(b.period, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
         WHERE b.connection_id = p_connection);
END
$$;

-- Sets (p_max_calls a number) or removes (NULL) one budget of a connection of the context's
-- site; audited. Returns the connection's budgets.
CREATE FUNCTION querylayer.set_budget(p_connection uuid, p_scope text, p_period text, p_max_calls integer, p_by text)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM querylayer.connections WHERE id = p_connection AND site_id = querylayer.ctx_site_id()) THEN
        RAISE EXCEPTION 'no connection % on this site', p_connection USING ERRCODE = 'QL404';
    END IF;
    IF p_scope IS NULL OR (p_scope <> '*write' AND NOT EXISTS (SELECT 1 FROM querylayer.scopes WHERE scope = p_scope)) THEN
        RAISE EXCEPTION 'scope: a scope of the catalogue, or *write for every write' USING ERRCODE = '22023';
    END IF;
    IF p_period IS NULL OR p_period NOT IN ('hour', 'day') THEN
        RAISE EXCEPTION 'period: hour or day' USING ERRCODE = '22023';
    END IF;
    IF p_max_calls IS NULL THEN
        DELETE FROM querylayer.connection_budgets WHERE connection_id = p_connection AND scope = p_scope AND period = p_period;
    ELSIF p_max_calls NOT BETWEEN 0 AND 100000000 THEN
        RAISE EXCEPTION 'max_calls: from 0 to 100000000' USING ERRCODE = '22023';
    ELSE
        INSERT INTO querylayer.connection_budgets (connection_id, site_id, scope, period, max_calls, set_by)
        VALUES (p_connection, querylayer.ctx_site_id(), p_scope, p_period, p_max_calls, p_by)
        ON CONFLICT (connection_id, scope, period) DO UPDATE SET max_calls = EXCLUDED.max_calls, set_by = EXCLUDED.set_by,
                                                                 set_at = now();
    END IF;
    PERFORM querylayer.audit('connection.budget'::text, p_connection::text,
        jsonb_build_object('scope', p_scope, 'period', p_period, 'max_calls', p_max_calls));
    RETURN jsonb_build_object('connection_id', p_connection, 'budgets', querylayer.budgets_json(p_connection));
END
$$;

CREATE FUNCTION querylayer_api.set_connection_budget(p_site text, p_connection uuid, p_scope text, p_period text,
                                                     p_max_calls integer) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator_site(p_site);
    RETURN querylayer.set_budget(p_connection, p_scope, p_period, p_max_calls, 'operator:' || querylayer.outer_user());
END
$$;

-- The budgets of every connection of a site that has any: [{connection_id, name, agent,
-- budgets: [{scope, period, max_calls, used, resets_at}]}].
CREATE FUNCTION querylayer_api.list_connection_budgets(p_site text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object('connection_id', c.id, 'name', c.name, 'agent', a.handle,
                                                         'budgets', querylayer.budgets_json(c.id)) ORDER BY c.created_at, c.id), '[]')
              FROM querylayer.connections c JOIN querylayer.agents a ON a.id = c.agent_id
             WHERE c.site_id = v_site.id
               AND EXISTS (SELECT 1 FROM querylayer.connection_budgets b WHERE b.connection_id = c.id));
END
$$;

-- The budgets of the member's site, as list_connection_budgets: any member may see them.
CREATE FUNCTION querylayer_api.console_list_connection_budgets() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object('connection_id', c.id, 'name', c.name, 'agent', a.handle,
                                                         'budgets', querylayer.budgets_json(c.id)) ORDER BY c.created_at, c.id), '[]')
              FROM querylayer.connections c JOIN querylayer.agents a ON a.id = c.agent_id
             WHERE c.site_id = querylayer.ctx_site_id()
               AND EXISTS (SELECT 1 FROM querylayer.connection_budgets b WHERE b.connection_id = c.id));
END
$$;

CREATE FUNCTION querylayer_api.console_set_connection_budget(p_connection uuid, p_scope text, p_period text,
                                                             p_max_calls integer) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.set_budget(p_connection, p_scope, p_period, p_max_calls, 'member:' || querylayer.ctx_member_id());
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.peer_failure_wait, querylayer_api.spend_peer_failure,
    querylayer_api.authenticate_edge, querylayer_api.take_connection_token, querylayer_api.console_set_connection_budget,
    querylayer_api.console_list_connection_budgets
    TO querylayer_edge;
