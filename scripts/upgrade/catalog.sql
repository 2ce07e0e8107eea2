-- Describes everything an installed querylayer consists of, one fact per row in a stable order,
-- so that two databases compare with diff: an upgraded one and a fresh install must print the
-- same text (scripts/test-upgrade). pg_dump -s does not show an extension's members, hence the
-- catalogs. Column order (attnum) is left out on purpose: a column added by an upgrade comes
-- last, and nothing in QueryLayer depends on column positions. Run with psql -X -q -At.
SET search_path = pg_catalog;

CREATE TEMP TABLE members AS
SELECT d.classid, d.objid, d.objsubid
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
 WHERE d.refclassid = 'pg_extension'::regclass AND e.extname = 'querylayer' AND d.deptype = 'e';

-- The schemas the extension lives in, and every relation and function in them (members or not).
CREATE TEMP TABLE nsp AS
SELECT n.oid, n.nspname FROM pg_namespace n WHERE n.nspname IN ('querylayer', 'querylayer_api')
UNION
SELECT n.oid, n.nspname FROM pg_namespace n WHERE n.oid IN (SELECT objid FROM members WHERE classid = 'pg_namespace'::regclass);

CREATE TEMP TABLE rels AS
SELECT c.oid::regclass::text AS ident, c.* FROM pg_class c WHERE c.relnamespace IN (SELECT oid FROM nsp);

CREATE FUNCTION pg_temp.acl(p_acl aclitem[], p_kind "char", p_owner oid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(format('%s:%s:%s%s', coalesce(g.rolname, 'PUBLIC'), o.rolname, x.privilege_type,
                                      CASE WHEN x.is_grantable THEN '*' ELSE '' END), ' '
                               ORDER BY coalesce(g.rolname, 'PUBLIC') COLLATE "C", x.privilege_type), '-')
      FROM aclexplode(coalesce(p_acl, acldefault(p_kind, p_owner))) x
      LEFT JOIN pg_roles g ON g.oid = x.grantee LEFT JOIN pg_roles o ON o.oid = x.grantor
$$;

CREATE FUNCTION pg_temp.comment(p_class regclass, p_oid oid, p_sub integer DEFAULT 0) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT description FROM pg_description
                      WHERE classoid = p_class AND objoid = p_oid AND objsubid = p_sub), '-')
$$;

CREATE FUNCTION pg_temp.member(p_class regclass, p_oid oid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM members WHERE classid = p_class AND objid = p_oid) THEN 'member' ELSE 'NOT A MEMBER' END
$$;

CREATE TEMP TABLE facts (kind text, ident text, detail text);

INSERT INTO facts
SELECT 'extension', e.extname, format('version %s, schema %s, relocatable %s', e.extversion,
                                      e.extnamespace::regnamespace, e.extrelocatable)
  FROM pg_extension e WHERE e.extname = 'querylayer';

INSERT INTO facts
SELECT 'schema', n.nspname, format('owner %s; acl %s; comment %s; %s', n.nspowner::regrole,
       pg_temp.acl(n.nspacl, 'n', n.nspowner), pg_temp.comment('pg_namespace', n.oid),
       pg_temp.member('pg_namespace', n.oid))
  FROM pg_namespace n WHERE n.oid IN (SELECT oid FROM nsp);

INSERT INTO facts
SELECT 'function', p.oid::regprocedure::text,
       format(E'owner %s; acl %s; comment %s; %s\n%s', p.proowner::regrole, pg_temp.acl(p.proacl, 'f', p.proowner),
              pg_temp.comment('pg_proc', p.oid), pg_temp.member('pg_proc', p.oid),
              CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid) ELSE p.prokind::text END)
  FROM pg_proc p WHERE p.pronamespace IN (SELECT oid FROM nsp);

INSERT INTO facts
SELECT 'relation', r.ident,
       format('kind %s; owner %s; persistence %s; options %s; row security %s, forced %s; acl %s; comment %s; %s',
              r.relkind, r.relowner::regrole, r.relpersistence, coalesce(array_to_string(r.reloptions, ','), '-'),
              r.relrowsecurity, r.relforcerowsecurity, pg_temp.acl(r.relacl, (CASE r.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", r.relowner),
              pg_temp.comment('pg_class', r.oid), pg_temp.member('pg_class', r.oid))
  FROM rels r WHERE r.relkind NOT IN ('i', 'I', 't');

INSERT INTO facts
SELECT 'view', r.ident, pg_get_viewdef(r.oid) FROM rels r WHERE r.relkind IN ('v', 'm');

INSERT INTO facts
SELECT 'column', format('%s.%I', r.ident, a.attname),
       format('%s; not null %s; default %s; identity %s; generated %s; collation %s; acl %s; comment %s',
              format_type(a.atttypid, a.atttypmod), a.attnotnull,
              coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-'), nullif(a.attidentity, '') IS NOT NULL,
              coalesce(nullif(a.attgenerated, ''), '-'), coalesce(a.attcollation::regcollation::text, '-'),
              coalesce(a.attacl::text, '-'), pg_temp.comment('pg_class', r.oid, a.attnum))
  FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = r.oid AND ad.adnum = a.attnum
 WHERE r.relkind IN ('r', 'p', 'v', 'm', 'c', 'f');

INSERT INTO facts
SELECT 'sequence', r.ident,
       format('type %s; start %s; increment %s; min %s; max %s; cache %s; cycle %s; owned by %s',
              s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
              coalesce((SELECT format('%s.%s (%s)', d.refobjid::regclass, a.attname, d.deptype)
                          FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                         WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid
                           AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '-'))
  FROM rels r JOIN pg_sequence s ON s.seqrelid = r.oid;

INSERT INTO facts
SELECT 'constraint', format('%s %I', r.ident, c.conname),
       format('%s; deferrable %s, deferred %s, validated %s; comment %s', pg_get_constraintdef(c.oid),
              c.condeferrable, c.condeferred, c.convalidated, pg_temp.comment('pg_constraint', c.oid))
  FROM rels r JOIN pg_constraint c ON c.conrelid = r.oid;

INSERT INTO facts
SELECT 'index', r.ident, format('%s; comment %s', pg_get_indexdef(r.oid), pg_temp.comment('pg_class', r.oid))
  FROM rels r WHERE r.relkind IN ('i', 'I');

INSERT INTO facts
SELECT 'trigger', format('%s %I', r.ident, t.tgname),
       format('%s; enabled %s; comment %s', pg_get_triggerdef(t.oid), t.tgenabled, pg_temp.comment('pg_trigger', t.oid))
  FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid WHERE NOT t.tgisinternal;

INSERT INTO facts
SELECT 'event trigger', e.evtname,
       format('on %s; tags %s; function %s; enabled %s; owner %s; comment %s; %s', e.evtevent,
              coalesce(array_to_string(e.evttags, ','), '-'), e.evtfoid::regprocedure, e.evtenabled,
              e.evtowner::regrole, pg_temp.comment('pg_event_trigger', e.oid), pg_temp.member('pg_event_trigger', e.oid))
  FROM pg_event_trigger e
 WHERE e.oid IN (SELECT objid FROM members WHERE classid = 'pg_event_trigger'::regclass)
    OR e.evtfoid IN (SELECT oid FROM pg_proc WHERE pronamespace IN (SELECT oid FROM nsp));

INSERT INTO facts
SELECT 'policy', format('%s %I', r.ident, p.polname),
       format('%s %s to %s using %s check %s; comment %s',
              CASE WHEN p.polpermissive THEN 'permissive' ELSE 'restrictive' END, p.polcmd,
              (SELECT string_agg(CASE WHEN x = 0 THEN 'PUBLIC' ELSE x::regrole::text END, ',' ORDER BY 1) FROM unnest(p.polroles) x),
              coalesce(pg_get_expr(p.polqual, p.polrelid), '-'), coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '-'),
              pg_temp.comment('pg_policy', p.oid))
  FROM rels r JOIN pg_policy p ON p.polrelid = r.oid;

INSERT INTO facts
SELECT 'type', t.oid::regtype::text,
       format('type %s; owner %s; acl %s; comment %s; %s', t.typtype, t.typowner::regrole,
              pg_temp.acl(t.typacl, 'T', t.typowner), pg_temp.comment('pg_type', t.oid), pg_temp.member('pg_type', t.oid))
  FROM pg_type t
 WHERE t.typnamespace IN (SELECT oid FROM nsp) AND t.typcategory <> 'A'
   AND (t.typrelid = 0 OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c');

-- Extension members outside the schemas above (anything else a script created).
INSERT INTO facts
SELECT 'member', pg_describe_object(m.classid, m.objid, m.objsubid), 'member'
  FROM members m
 WHERE NOT (m.classid = 'pg_class'::regclass AND m.objid IN (SELECT oid FROM rels))
   AND NOT (m.classid = 'pg_proc'::regclass AND m.objid IN (SELECT oid FROM pg_proc WHERE pronamespace IN (SELECT oid FROM nsp)))
   AND NOT (m.classid = 'pg_namespace'::regclass)
   AND NOT (m.classid = 'pg_event_trigger'::regclass)
   AND NOT (m.classid = 'pg_type'::regclass AND m.objid IN (SELECT oid FROM pg_type WHERE typnamespace IN (SELECT oid FROM nsp)));

INSERT INTO facts
SELECT 'config dump', c.tbl::regclass::text, coalesce(nullif(c.cond, ''), 'every row')
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS c (tbl, cond)
 WHERE e.extname = 'querylayer';

-- The privileges pg_dump compares the current ones with (extension objects only). Not those of
-- the month partitions: they are not the extension's (pg_dump dumps them whole, and ignores what
-- an install script's REVOKE recorded for them), so a restored one has none.
INSERT INTO facts
SELECT 'initial privileges', pg_describe_object(i.classoid, i.objoid, i.objsubid),
       format('%s: %s', i.privtype, pg_temp.acl(i.initprivs, 'r', 10))
  FROM pg_init_privs i
 WHERE EXISTS (SELECT 1 FROM members m WHERE m.classid = i.classoid AND m.objid = i.objoid)
    OR (i.classoid = 'pg_class'::regclass AND i.objoid IN (SELECT oid FROM rels)
        AND NOT (SELECT c.relispartition FROM pg_class c WHERE c.oid = i.objoid))
    OR (i.classoid = 'pg_namespace'::regclass AND i.objoid IN (SELECT oid FROM nsp));

-- The extension's catalogs: rows every install writes alike (querylayer.catalog_tables()), and
-- the settings keys (their values are the operators').
INSERT INTO facts SELECT 'ledger table', table_name, '' FROM querylayer.ledger_tables;
INSERT INTO facts SELECT 'ledger form', format('%s %s', table_name, form), array_to_string(fields, ',') FROM querylayer.ledger_forms;
INSERT INTO facts SELECT 'scope', scope, description FROM querylayer.scopes;
INSERT INTO facts SELECT 'proposal type', type, format('%s %s %s %s', risk, required_scope, decider_roles, description) FROM querylayer.proposal_types;
INSERT INTO facts SELECT 'task operation', operation, format('%s %s %s %s', risk, required_scope, proposal_type, description) FROM querylayer.task_operations;
INSERT INTO facts SELECT 'setting', key, '' FROM querylayer.settings;

SELECT format('%s | %s | %s', kind, ident, detail) FROM facts ORDER BY kind COLLATE "C", ident COLLATE "C", detail COLLATE "C";
