-- Ownership, privileges and the last guards. Loaded last.

-- Every table belongs to querylayer_owner (NOLOGIN, NOBYPASSRLS); row-level security is FORCEd
-- on every table that carries site_id, so it applies inside the owner's own functions too.
DO $own$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS tbl
               FROM pg_catalog.pg_class c
              WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind IN ('r', 'p') LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO querylayer_owner', r.tbl);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS fn
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace IN ('querylayer'::regnamespace, 'querylayer_api'::regnamespace) LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO querylayer_owner', r.fn);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS tbl
               FROM pg_catalog.pg_class c
              WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind IN ('r', 'p')
                AND (NOT c.relrowsecurity OR NOT c.relforcerowsecurity)
                AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                             WHERE a.attrelid = c.oid AND a.attname = 'site_id' AND NOT a.attisdropped) LOOP
        RAISE EXCEPTION 'site-owned table % lacks forced row-level security', r.tbl;
    END LOOP;
END
$own$;

-- Logical backups (docs/operations.md). pg_dump leaves an extension's tables out unless they are
-- registered as its configuration tables, so every table whose rows are data is registered here,
-- whole: a plain pg_dump then holds all of them. The extension's catalogs are not (every install
-- writes the same rows there, from its own version).
DO $dump$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS tbl
               FROM pg_catalog.pg_class c
              WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind IN ('r', 'p', 'S')
                AND NOT c.relispartition
                AND NOT (c.relname::text = ANY (querylayer.catalog_tables()))
              ORDER BY c.relname LOOP
        PERFORM pg_catalog.pg_extension_config_dump(r.tbl, '');
    END LOOP;
END
$dump$;

REVOKE ALL ON ALL TABLES IN SCHEMA querylayer FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA querylayer FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA querylayer FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA querylayer_api FROM PUBLIC;

-- The edge's grants are made beside each function (GRANT … TO querylayer_edge). Operators may
-- call the whole surface, the governed agent and member functions included.
GRANT EXECUTE ON FUNCTION querylayer_api.authenticate, querylayer_api.authenticate_member,
    querylayer_api.record_failed_authentication, querylayer_api.record_failed_member_authentication,
    querylayer_api.authenticate_envelope, querylayer_api.verify_envelope,
    -- The dashboard (sign-in, invitations) and the delivery API (sql/175, sql/180).
    querylayer_api.sign_in, querylayer_api.invitation, querylayer_api.accept_invitation,
    querylayer_api.authenticate_delivery, querylayer_api.record_failed_delivery_authentication,
    -- The OAuth token and revocation endpoints (sql/190_oauth.sql, extension/src/oauth.rs).
    querylayer_api.oauth_redeem_code, querylayer_api.oauth_refresh, querylayer_api.oauth_revoke_refresh
    TO querylayer_edge;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA querylayer_api TO querylayer_admin;

-- The owner may create tables in its schema for one reason: the month partitions of the aging
-- tables (extension/src/partitions.rs). refuse_owner_ddl below refuses every other DDL it tries.
GRANT CREATE ON SCHEMA querylayer TO querylayer_owner;

-- The owner role exists to own; it is never meant to act. Refuse any DDL it attempts (for
-- example ALTER TABLE … DISABLE TRIGGER, which a table owner could otherwise run). The one
-- exception is the extension's own partition maintenance (extension/src/partitions.rs), which
-- creates and drops month partitions of the aging tables while it runs, and nothing else.
CREATE FUNCTION querylayer.refuse_owner_ddl() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.pg_has_role(current_user, 'querylayer_owner', 'USAGE')
       AND NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        IF querylayer.partition_maintenance_active() THEN
            RETURN;
        END IF;
        RAISE EXCEPTION 'querylayer_owner may not run DDL (%); schema changes go through extension upgrades', tg_tag
            USING ERRCODE = '42501';
    END IF;
END
$$;
CREATE EVENT TRIGGER querylayer_refuse_owner_ddl ON ddl_command_start
    EXECUTE FUNCTION querylayer.refuse_owner_ddl();
ALTER EVENT TRIGGER querylayer_refuse_owner_ddl ENABLE ALWAYS;
REVOKE EXECUTE ON FUNCTION querylayer.refuse_owner_ddl() FROM PUBLIC;

-- Every SQL and PL/pgSQL function of the extension runs with search_path = pg_catalog, pg_temp,
-- whoever calls it and from whatever session: the governed functions pin it themselves, and the
-- rest (helpers, triggers, the event trigger) get it here. So no schema on a caller's path (a
-- tenant can set a database's default search_path) can answer for an unqualified function or
-- operator inside them, not even when a superuser's own statement fires a trigger. (Functions in
-- C that run SQL pin it in their Rust declaration.) The price of the pin for an SQL-language
-- function: it is never inlined, and PostgreSQL parses and plans its body again in every
-- transaction that calls it (15-20 µs a call); a PL/pgSQL function keeps its plans for the
-- session. So the schemas hold no SQL-language function (pg_tests/context.rs checks).
DO $pin$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.oid::pg_catalog.regprocedure AS fn
               FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
              WHERE p.pronamespace OPERATOR(pg_catalog.=) ANY (ARRAY['querylayer'::pg_catalog.regnamespace,
                                                                     'querylayer_api'::pg_catalog.regnamespace]::pg_catalog.oid[])
                AND l.lanname OPERATOR(pg_catalog.<>) 'c'::pg_catalog.name
                AND NOT coalesce('search_path=pg_catalog, pg_temp'::pg_catalog.text OPERATOR(pg_catalog.=) ANY (p.proconfig), false) LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', r.fn);
    END LOOP;
END
$pin$;
