-- Readiness, as the database sees it: reachable (this answers at all), writable (not a standby,
-- not read-only, and room on the disks of the data directory and the WAL), and the extension's
-- version. The edge asks on a connection of its own, outside its pool, so a site whose calls
-- hold every pooled connection does not make a healthy database look down.

CREATE FUNCTION querylayer_api.health() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_disk      jsonb := querylayer.disk_free();
    v_min       bigint := coalesce(querylayer.setting_int('readiness_min_free_mb'::text), 64)::bigint * 1048576;
    v_recovery  boolean := pg_catalog.pg_is_in_recovery();
    v_read_only boolean := pg_catalog.current_setting('default_transaction_read_only')::boolean;
    v_free      bigint := least((v_disk->>'data_free_bytes')::bigint, (v_disk->>'wal_free_bytes')::bigint);
BEGIN
    RETURN jsonb_build_object(
        'extension_version', (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'querylayer'),
        'in_recovery', v_recovery,
        'read_only', v_read_only,
        'free_bytes', v_free,
        'min_free_bytes', v_min,
        'writable', NOT v_recovery AND NOT v_read_only AND (v_free IS NULL OR v_free >= v_min));
END
$$;
GRANT EXECUTE ON FUNCTION querylayer_api.health TO querylayer_edge;
