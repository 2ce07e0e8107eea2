-- Issue 12: every SQL and PL/pgSQL function of the extension runs with
-- search_path = pg_catalog, pg_temp, whoever calls it (sql/990_privileges.sql does the same on
-- a fresh install; this covers functions an upgrade re-created without the setting).
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
