-- The generated parts of an upgrade script (scripts/upgrade-script), read from the catalog of a
-- fresh install of the new version. Expects pg_temp.old_facts (scripts/upgrade/facts.sql of a
-- fresh install of the old version) and the psql variable `section`:
--   functions  every function whose definition the old version does not have as it is: CREATE
--              OR REPLACE (and a DROP first when its parameters or result changed, which CREATE
--              OR REPLACE cannot do); then of every function, changed or not: owner, comment,
--              grants (so the privileges are reset whatever changed);
--   rest       row security, owners, triggers, event triggers, policies, grants, comments,
--              pg_extension_config_dump registrations and ledger forms; then drops of the
--              functions, triggers, policies and event triggers the old version had and this one
--              has not.
-- One statement per row, in a stable order. Run with psql -X -q -At.
SET search_path = pg_catalog;

CREATE TEMP TABLE members AS
SELECT d.classid, d.objid
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
 WHERE d.refclassid = 'pg_extension'::regclass AND e.extname = 'querylayer' AND d.deptype = 'e';

CREATE TEMP TABLE rels AS
SELECT c.oid, c.oid::regclass::text AS ident, c.relkind, c.relowner, c.relacl, c.relrowsecurity,
       c.relforcerowsecurity
  FROM pg_class c WHERE c.oid IN (SELECT objid FROM members WHERE classid = 'pg_class'::regclass);

CREATE TEMP TABLE procs AS
SELECT p.oid, p.oid::regprocedure::text AS ident, p.proowner, p.proacl, p.prokind
  FROM pg_proc p WHERE p.oid IN (SELECT objid FROM members WHERE classid = 'pg_proc'::regclass);

CREATE TEMP TABLE schemas AS
SELECT n.oid, n.nspname, n.nspowner, n.nspacl
  FROM pg_namespace n
 WHERE n.oid IN (SELECT objid FROM members WHERE classid = 'pg_namespace'::regclass)
    OR n.nspname IN ('querylayer', 'querylayer_api');

-- The roles whose privileges an upgrade resets: every role either version grants anything to.
CREATE TEMP TABLE managed AS
SELECT name AS rolname FROM old_facts WHERE kind = 'grantee'
UNION
SELECT r.rolname::text
  FROM (SELECT relacl AS acl FROM rels UNION ALL SELECT proacl FROM procs UNION ALL SELECT nspacl FROM schemas) o,
       LATERAL aclexplode(o.acl) x JOIN pg_roles r ON r.oid = x.grantee
 WHERE NOT r.rolsuper;

-- REVOKE from PUBLIC and every managed role but the owner, then the GRANTs of the fresh ACL.
-- Nothing for an object whose ACL is the default (NULL).
CREATE FUNCTION pg_temp.acl_statements(p_kind text, p_name text, p_owner oid, p_acl aclitem[]) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_acl IS NULL THEN NULL ELSE
        format('REVOKE ALL ON %s %s FROM %s;', p_kind, p_name,
               (SELECT string_agg(g, ', ' ORDER BY o, g COLLATE "C")
                  FROM (SELECT 0 AS o, 'PUBLIC' AS g
                        UNION ALL
                        SELECT 1, quote_ident(m.rolname) FROM managed m
                         WHERE m.rolname <> (SELECT rolname FROM pg_roles WHERE oid = p_owner)) r))
        || coalesce((SELECT string_agg(format(E'\nGRANT %s ON %s %s TO %s%s;', privs, p_kind, p_name, grantee,
                                              CASE WHEN grantable THEN ' WITH GRANT OPTION' ELSE '' END),
                                       '' ORDER BY grantee COLLATE "C", grantable)
                       FROM (SELECT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS grantee,
                                    x.is_grantable AS grantable,
                                    string_agg(x.privilege_type, ', ' ORDER BY x.privilege_type) AS privs
                               FROM aclexplode(p_acl) x LEFT JOIN pg_roles r ON r.oid = x.grantee
                              WHERE x.grantee <> p_owner
                              GROUP BY 1, 2) g), '')
    END
$$;

-- An object's owner, unless it is a superuser (the role that ran CREATE EXTENSION, whatever
-- its name: an upgrade leaves such objects as they are).
CREATE FUNCTION pg_temp.owner_name(p_owner oid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT quote_ident(rolname) FROM pg_roles WHERE oid = p_owner AND NOT rolsuper
$$;

CREATE TEMP TABLE statements (section text, ord text, stmt text);

-- ---------------------------------------------------------------------------------------------
-- functions
INSERT INTO statements
SELECT 'functions', p.ident || ' 0', format('DROP FUNCTION IF EXISTS %s;', p.ident)
  FROM procs p JOIN old_facts o ON o.kind = 'function' AND o.ident = p.ident
 WHERE o.detail <> pg_get_function_arguments(p.oid) || ' => ' || pg_get_function_result(p.oid)
UNION ALL
SELECT 'functions', p.ident || ' 1',
       concat_ws(E'\n',
           -- (the definition names the parameters and the result, so a changed signature is a
           -- changed definition)
           (SELECT rtrim(pg_get_functiondef(p.oid), E'\n') || ';'
             WHERE NOT EXISTS (SELECT 1 FROM old_facts o
                                WHERE o.kind = 'definition' AND o.ident = p.ident
                                  AND o.detail = md5(pg_get_functiondef(p.oid)))),
           (SELECT format('ALTER %s %s OWNER TO %s;', CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                          p.ident, pg_temp.owner_name(p.proowner))
             WHERE pg_temp.owner_name(p.proowner) IS NOT NULL),
           (SELECT format('COMMENT ON FUNCTION %s IS %L;', p.ident, d.description)
              FROM pg_description d WHERE d.classoid = 'pg_proc'::regclass AND d.objoid = p.oid AND d.objsubid = 0),
           pg_temp.acl_statements(CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, p.ident, p.proowner, p.proacl))
  FROM procs p WHERE p.prokind IN ('f', 'p')
UNION ALL
SELECT 'functions', o.ident || ' 2', format('COMMENT ON %s IS NULL;', o.ident)
  FROM old_facts o
 WHERE o.kind = 'comment' AND o.ident LIKE 'FUNCTION %'
   AND EXISTS (SELECT 1 FROM procs p WHERE 'FUNCTION ' || p.ident = o.ident
                  AND NOT EXISTS (SELECT 1 FROM pg_description d
                                   WHERE d.classoid = 'pg_proc'::regclass AND d.objoid = p.oid AND d.objsubid = 0));

-- ---------------------------------------------------------------------------------------------
-- rest: schemas
INSERT INTO statements
SELECT 'rest', '1 ' || s.nspname,
       concat_ws(E'\n',
           (SELECT format('ALTER SCHEMA %I OWNER TO %s;', s.nspname, pg_temp.owner_name(s.nspowner))
             WHERE pg_temp.owner_name(s.nspowner) IS NOT NULL),
           pg_temp.acl_statements('SCHEMA', quote_ident(s.nspname), s.nspowner, s.nspacl),
           coalesce((SELECT format('COMMENT ON SCHEMA %I IS %L;', s.nspname, d.description)
                       FROM pg_description d WHERE d.classoid = 'pg_namespace'::regclass AND d.objoid = s.oid),
                    (SELECT format('COMMENT ON SCHEMA %I IS NULL;', s.nspname)
                       FROM old_facts o WHERE o.kind = 'comment' AND o.ident = format('SCHEMA %I', s.nspname))))
  FROM schemas s;

-- tables, views and sequences: owner, row security, grants, comments on them and their columns
INSERT INTO statements
SELECT 'rest', '2 ' || r.ident,
       concat_ws(E'\n',
           (SELECT format('ALTER %s %s OWNER TO %s;', kind, r.ident, pg_temp.owner_name(r.relowner))
             WHERE pg_temp.owner_name(r.relowner) IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid
                                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))),
           CASE WHEN r.relkind IN ('r', 'p') THEN
               format(E'ALTER TABLE %s %s ROW LEVEL SECURITY;\nALTER TABLE %s %s ROW LEVEL SECURITY;',
                      r.ident, CASE WHEN r.relrowsecurity THEN 'ENABLE' ELSE 'DISABLE' END,
                      r.ident, CASE WHEN r.relforcerowsecurity THEN 'FORCE' ELSE 'NO FORCE' END) END,
           pg_temp.acl_statements(CASE r.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, r.ident, r.relowner, r.relacl),
           (SELECT string_agg(CASE WHEN d.objsubid = 0 THEN format('COMMENT ON %s %s IS %L;', kind, r.ident, d.description)
                                   ELSE format('COMMENT ON COLUMN %s.%I IS %L;', r.ident, a.attname, d.description) END,
                              E'\n' ORDER BY d.objsubid)
              FROM pg_description d LEFT JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum = d.objsubid
             WHERE d.classoid = 'pg_class'::regclass AND d.objoid = r.oid),
           (SELECT string_agg(format('COMMENT ON %s IS NULL;', o.ident), E'\n' ORDER BY o.ident COLLATE "C")
              FROM old_facts o
             WHERE o.kind = 'comment'
               AND (o.ident = 'TABLE ' || r.ident
                    AND NOT EXISTS (SELECT 1 FROM pg_description d
                                     WHERE d.classoid = 'pg_class'::regclass AND d.objoid = r.oid AND d.objsubid = 0)
                    OR o.ident LIKE 'COLUMN ' || r.ident || '.%'
                    AND EXISTS (SELECT 1 FROM pg_attribute a
                                 WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                                   AND format('COLUMN %s.%I', r.ident, a.attname) = o.ident
                                   AND NOT EXISTS (SELECT 1 FROM pg_description d
                                                    WHERE d.classoid = 'pg_class'::regclass AND d.objoid = r.oid
                                                      AND d.objsubid = a.attnum)))))
  FROM rels r
  CROSS JOIN LATERAL (SELECT CASE r.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                            WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END AS kind) k
 WHERE r.relkind IN ('r', 'p', 'v', 'm', 'S');

-- comments on indexes and constraints of the extension's tables
INSERT INTO statements
SELECT 'rest', '3 ' || r.ident || ' ' || i.indexrelid::regclass::text,
       format('COMMENT ON INDEX %s IS %L;', i.indexrelid::regclass, d.description)
  FROM rels r JOIN pg_index i ON i.indrelid = r.oid
  JOIN pg_description d ON d.classoid = 'pg_class'::regclass AND d.objoid = i.indexrelid AND d.objsubid = 0
UNION ALL
SELECT 'rest', '3 ' || r.ident || ' ' || c.conname,
       format('COMMENT ON CONSTRAINT %I ON %s IS %L;', c.conname, r.ident, d.description)
  FROM rels r JOIN pg_constraint c ON c.conrelid = r.oid
  JOIN pg_description d ON d.classoid = 'pg_constraint'::regclass AND d.objoid = c.oid;

-- triggers, with their enabled state and comments
INSERT INTO statements
SELECT 'rest', '4 ' || r.ident || ' ' || t.tgname,
       concat_ws(E'\n',
           CASE WHEN pg_get_triggerdef(t.oid) LIKE 'CREATE CONSTRAINT TRIGGER %'
                THEN format(E'DROP TRIGGER IF EXISTS %I ON %s;\n%s;', t.tgname, r.ident, pg_get_triggerdef(t.oid))
                ELSE regexp_replace(pg_get_triggerdef(t.oid), '^CREATE TRIGGER ', 'CREATE OR REPLACE TRIGGER ') || ';' END,
           format('ALTER TABLE %s %s TRIGGER %I;', r.ident,
                  CASE t.tgenabled WHEN 'A' THEN 'ENABLE ALWAYS' WHEN 'R' THEN 'ENABLE REPLICA'
                                   WHEN 'D' THEN 'DISABLE' ELSE 'ENABLE' END, t.tgname),
           (SELECT format('COMMENT ON TRIGGER %I ON %s IS %L;', t.tgname, r.ident, d.description)
              FROM pg_description d WHERE d.classoid = 'pg_trigger'::regclass AND d.objoid = t.oid))
  FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid
 WHERE NOT t.tgisinternal;

-- event triggers
INSERT INTO statements
SELECT 'rest', '5 ' || e.evtname,
       concat_ws(E'\n',
           format('DROP EVENT TRIGGER IF EXISTS %I;', e.evtname),
           format('CREATE EVENT TRIGGER %I ON %I%s EXECUTE FUNCTION %s();', e.evtname, e.evtevent,
                  CASE WHEN e.evttags IS NULL THEN ''
                       ELSE ' WHEN TAG IN (' || (SELECT string_agg(quote_literal(tag), ', ') FROM unnest(e.evttags) tag) || ')' END,
                  e.evtfoid::regproc),
           format('ALTER EVENT TRIGGER %I %s;', e.evtname,
                  CASE e.evtenabled WHEN 'A' THEN 'ENABLE ALWAYS' WHEN 'R' THEN 'ENABLE REPLICA'
                                    WHEN 'D' THEN 'DISABLE' ELSE 'ENABLE' END),
           (SELECT format('ALTER EVENT TRIGGER %I OWNER TO %s;', e.evtname, pg_temp.owner_name(e.evtowner))
             WHERE pg_temp.owner_name(e.evtowner) IS NOT NULL),
           (SELECT format('COMMENT ON EVENT TRIGGER %I IS %L;', e.evtname, d.description)
              FROM pg_description d WHERE d.classoid = 'pg_event_trigger'::regclass AND d.objoid = e.oid))
  FROM pg_event_trigger e
 WHERE e.oid IN (SELECT objid FROM members WHERE classid = 'pg_event_trigger'::regclass);

-- policies
INSERT INTO statements
SELECT 'rest', '6 ' || r.ident || ' ' || p.polname,
       concat_ws(E'\n',
           format('DROP POLICY IF EXISTS %I ON %s;', p.polname, r.ident),
           format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s;', p.polname, r.ident,
                  CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                  CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                                WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                  (SELECT string_agg(CASE WHEN x = 0 THEN 'PUBLIC' ELSE quote_ident(ro.rolname) END, ', '
                                     ORDER BY CASE WHEN x = 0 THEN '' ELSE ro.rolname::text END COLLATE "C")
                     FROM unnest(p.polroles) x LEFT JOIN pg_roles ro ON ro.oid = x),
                  coalesce(' USING (' || pg_get_expr(p.polqual, p.polrelid) || ')', ''),
                  coalesce(' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')', '')),
           (SELECT format('COMMENT ON POLICY %I ON %s IS %L;', p.polname, r.ident, d.description)
              FROM pg_description d WHERE d.classoid = 'pg_policy'::regclass AND d.objoid = p.oid))
  FROM rels r JOIN pg_policy p ON p.polrelid = r.oid;

-- logical backups: the configuration tables and their filters
INSERT INTO statements
SELECT 'rest', '7 ' || c.tbl::regclass::text,
       format('SELECT pg_catalog.pg_extension_config_dump(%L, %L);', c.tbl::regclass::text, coalesce(c.cond, ''))
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS c (tbl, cond)
 WHERE e.extname = 'querylayer';

-- the canonical forms of chained records, as a fresh install registers them
INSERT INTO statements
SELECT 'rest', format('8 %s %s', f.table_name, lpad(f.form::text, 5, '0')),
       format('SELECT querylayer.ensure_ledger_form(%L, %s::smallint, %L);', f.table_name, f.form, f.fields)
  FROM querylayer.ledger_forms f;

-- drops: what the old version had and this one has not
INSERT INTO statements
SELECT 'rest', '9 1 ' || o.ident || ' ' || o.name, format('DROP TRIGGER IF EXISTS %I ON %s;', o.name, o.ident)
  FROM old_facts o
 WHERE o.kind = 'trigger'
   AND NOT EXISTS (SELECT 1 FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid
                    WHERE NOT t.tgisinternal AND r.ident = o.ident AND t.tgname::text = o.name)
UNION ALL
SELECT 'rest', '9 2 ' || o.ident || ' ' || o.name, format('DROP POLICY IF EXISTS %I ON %s;', o.name, o.ident)
  FROM old_facts o
 WHERE o.kind = 'policy'
   AND NOT EXISTS (SELECT 1 FROM rels r JOIN pg_policy p ON p.polrelid = r.oid
                    WHERE r.ident = o.ident AND p.polname::text = o.name)
UNION ALL
SELECT 'rest', '9 3 ' || o.name, format('DROP EVENT TRIGGER IF EXISTS %I;', o.name)
  FROM old_facts o
 WHERE o.kind = 'event_trigger'
   AND NOT EXISTS (SELECT 1 FROM pg_event_trigger e WHERE e.evtname::text = o.name
                      AND e.oid IN (SELECT objid FROM members WHERE classid = 'pg_event_trigger'::regclass))
UNION ALL
SELECT 'rest', '9 4 ' || o.ident, format('DROP FUNCTION IF EXISTS %s;', o.ident)
  FROM old_facts o
 WHERE o.kind = 'function' AND NOT EXISTS (SELECT 1 FROM procs p WHERE p.ident = o.ident);

SELECT stmt || E'\n' FROM statements WHERE section = :'section' AND stmt IS NOT NULL AND stmt <> ''
 ORDER BY ord COLLATE "C";
