-- The facts of an installed querylayer that the upgrade script generator needs from the version
-- it upgrades from (scripts/upgrade-script): its functions (with their signatures and the MD5 of
-- their definitions), triggers,
-- policies, event triggers, the roles its privileges name, and what it comments on. One row
-- each, in COPY text format: kind, ident, name, detail.
SET search_path = pg_catalog;

COPY (
WITH members AS (
    SELECT d.classid, d.objid
      FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
     WHERE d.refclassid = 'pg_extension'::regclass AND e.extname = 'querylayer' AND d.deptype = 'e'
), member_rels AS (
    SELECT c.oid, c.relacl AS acl FROM pg_class c
     WHERE c.oid IN (SELECT objid FROM members WHERE classid = 'pg_class'::regclass)
), member_procs AS (
    SELECT p.oid, p.proacl AS acl FROM pg_proc p
     WHERE p.oid IN (SELECT objid FROM members WHERE classid = 'pg_proc'::regclass)
), member_schemas AS (
    SELECT n.oid, n.nspacl AS acl FROM pg_namespace n
     WHERE n.oid IN (SELECT objid FROM members WHERE classid = 'pg_namespace'::regclass)
        OR n.nspname IN ('querylayer', 'querylayer_api')
), facts (kind, ident, name, detail) AS (
    SELECT 'function', p.oid::regprocedure::text, '',
           pg_get_function_arguments(p.oid) || ' => ' || pg_get_function_result(p.oid)
      FROM member_procs p
    UNION ALL
    SELECT 'definition', p.oid::regprocedure::text, '', md5(pg_get_functiondef(p.oid))
      FROM member_procs p JOIN pg_proc f ON f.oid = p.oid WHERE f.prokind IN ('f', 'p')
    UNION ALL
    SELECT 'trigger', t.tgrelid::regclass::text, t.tgname::text, ''
      FROM pg_trigger t WHERE NOT t.tgisinternal AND t.tgrelid IN (SELECT oid FROM member_rels)
    UNION ALL
    SELECT 'policy', p.polrelid::regclass::text, p.polname::text, ''
      FROM pg_policy p WHERE p.polrelid IN (SELECT oid FROM member_rels)
    UNION ALL
    SELECT 'event_trigger', '', e.evtname::text, ''
      FROM pg_event_trigger e WHERE e.oid IN (SELECT objid FROM members WHERE classid = 'pg_event_trigger'::regclass)
    UNION ALL
    SELECT DISTINCT 'grantee', '', r.rolname::text, ''
      FROM (SELECT acl FROM member_rels UNION ALL SELECT acl FROM member_procs UNION ALL SELECT acl FROM member_schemas) o,
           LATERAL aclexplode(o.acl) x JOIN pg_roles r ON r.oid = x.grantee
     WHERE NOT r.rolsuper
    UNION ALL
    SELECT 'comment', 'FUNCTION ' || p.oid::regprocedure::text, '', ''
      FROM member_procs p JOIN pg_description d ON d.classoid = 'pg_proc'::regclass AND d.objoid = p.oid AND d.objsubid = 0
    UNION ALL
    SELECT 'comment', CASE WHEN d.objsubid = 0 THEN 'TABLE ' || c.oid::regclass::text
                           ELSE format('COLUMN %s.%I', c.oid::regclass, a.attname) END, '', ''
      FROM member_rels c JOIN pg_description d ON d.classoid = 'pg_class'::regclass AND d.objoid = c.oid
      LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.objsubid
     WHERE (SELECT relkind FROM pg_class WHERE oid = c.oid) IN ('r', 'p')
    UNION ALL
    SELECT 'comment', format('SCHEMA %I', n.nspname), '', ''
      FROM member_schemas s JOIN pg_namespace n ON n.oid = s.oid
      JOIN pg_description d ON d.classoid = 'pg_namespace'::regclass AND d.objoid = n.oid
)
SELECT kind, ident, name, detail FROM facts ORDER BY kind COLLATE "C", ident COLLATE "C", name COLLATE "C"
) TO STDOUT;
