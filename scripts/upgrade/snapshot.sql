-- What an upgrade or a restore must keep, one line per fact (scripts/test-upgrade,
-- scripts/test-backup): per table, its row count and a digest of its rows over the columns named
-- in the psql variable `columns` (a JSON object: table → [column], the columns of the version
-- the history was written by; later columns are left out); per site, what verify_ledger says
-- (its chain head). Run as a superuser with psql -X -q -At.
SET search_path = pg_catalog;

CREATE FUNCTION pg_temp.digest(p_table regclass, p_columns text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    EXECUTE format(
        'SELECT count(*) || '' '' || md5(coalesce(string_agg(r, E''\n'' ORDER BY r COLLATE "C"), ''''))
           FROM (SELECT (SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(to_jsonb(t)) e
                          WHERE e.key = ANY ($1))::text AS r
                   FROM %s t) rows', p_table)
       INTO v USING p_columns;
    RETURN v;
END
$$;

SET TimeZone = 'UTC';
-- (ledger_heads is the history line below: an upgrade may append to a chain; ledger_tables is
-- one of the extension's catalogs, which the catalog comparison covers; the liveness generation
-- is each database's own, moved by every change of authority and never dumped.)
SELECT format('table %s %s', c.key, pg_temp.digest(c.key::regclass, ARRAY(SELECT jsonb_array_elements_text(c.value))))
  FROM jsonb_each(:'columns'::jsonb) c
 WHERE c.key NOT IN ('querylayer.ledger_heads', 'querylayer.ledger_tables', 'querylayer.liveness_generation')
 ORDER BY c.key COLLATE "C";
CREATE FUNCTION pg_temp.history(p_site uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_seq  bigint;
    v_base bigint := 0;
    v_hash bytea;
    v_sql  text;
BEGIN
    SELECT seq INTO v_seq FROM querylayer.ledger_heads WHERE site_id = p_site;
    IF to_regclass('querylayer.state_events') IS NOT NULL THEN
        EXECUTE 'SELECT count(*) FROM querylayer.state_events WHERE site_id = $1 AND cause = ''baseline'''
           INTO v_base USING p_site;
    END IF;
    SELECT string_agg(format('SELECT record_sha256 FROM %s WHERE site_id = $1 AND chain_seq = $2', table_name), ' UNION ALL ')
      INTO v_sql FROM querylayer.ledger_tables;
    EXECUTE v_sql INTO v_hash USING p_site, v_seq - v_base;
    RETURN (v_seq - v_base) || ' ' || coalesce(encode(v_hash, 'hex'), 'none');
END
$$;

SELECT format('ledger %s ok=%s history=%s', s.slug, querylayer_api.verify_ledger(s.slug)->'ok', pg_temp.history(s.id))
  FROM querylayer.sites s
 ORDER BY s.slug COLLATE "C";
