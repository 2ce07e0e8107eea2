-- 0.10.0 refuses to install into a database that is not UTF8 (sql/000_bootstrap.sql). A database
-- that already holds querylayer in another encoding is upgraded all the same, with the warning:
-- its non-ASCII text is refused by the extension or stored as other bytes than the agents sent.
DO $encoding$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8'::pg_catalog.name THEN
        RAISE WARNING 'querylayer needs a UTF8 database; database % is encoded %',
            pg_catalog.quote_ident(pg_catalog.current_database()), pg_catalog.getdatabaseencoding()
            USING HINT = 'dump it and restore it into a database made with ENCODING ''UTF8'' (docs/security.md, "Install and schemas")';
    END IF;
END
$encoding$;
