-- Every row of the tables named in the psql variable `tables` (a JSON array), over the columns the
-- psql variable `columns` names for each (as in snapshot.sql), one line per row:
-- "<table> <row as JSON>". scripts/test-upgrade compares these for the tables a release may add
-- rows to (its catalogs and the settings): every row of the previous release must still be there.
-- Run as a superuser with psql -X -q -At.
SET search_path = pg_catalog;

CREATE FUNCTION pg_temp.rows(p_table regclass, p_columns text[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        'SELECT %L || '' '' || (SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(to_jsonb(t)) e
                                  WHERE e.key = ANY ($1))::text
           FROM %s t', p_table::text, p_table)
       USING p_columns;
END
$$;

SET TimeZone = 'UTC';
SELECT r
  FROM jsonb_each(:'columns'::jsonb) c, LATERAL pg_temp.rows(c.key::regclass, ARRAY(SELECT jsonb_array_elements_text(c.value))) r
 WHERE c.key IN (SELECT jsonb_array_elements_text(:'tables'::jsonb))
 ORDER BY r COLLATE "C";
