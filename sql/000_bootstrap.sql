-- Roles and schemas. Loaded first.
--
-- querylayer_owner  NOLOGIN, NOBYPASSRLS: owns every table and every SECURITY DEFINER function,
--                   so row-level security (FORCEd) still applies inside the governed functions.
-- querylayer_edge   the runtime role of the edge: EXECUTE on the agent-facing functions of
--                   querylayer_api, nothing else. Operators give it LOGIN and a password.
-- querylayer_worker the background worker (`querylayer worker`): EXECUTE on the worker
--                   functions only (evidence re-verification, retention purges).
-- querylayer_admin  operators (DBAs): EXECUTE on the operator functions of querylayer_api.
--
-- Roles are cluster-wide, so a second database of the same cluster finds them already made; the
-- attributes that matter for safety are asserted every time.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'querylayer_owner') THEN
        CREATE ROLE querylayer_owner NOLOGIN;
    END IF;
    ALTER ROLE querylayer_owner NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;

    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'querylayer_edge') THEN
        CREATE ROLE querylayer_edge NOLOGIN;
    END IF;
    ALTER ROLE querylayer_edge NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;

    -- The edge passes fingerprints (and member-token fingerprints) as bind parameters; keep
    -- them out of the server log even with log_statement = all.
    ALTER ROLE querylayer_edge SET log_parameter_max_length = 0;
    ALTER ROLE querylayer_edge SET log_parameter_max_length_on_error = 0;

    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'querylayer_worker') THEN
        CREATE ROLE querylayer_worker NOLOGIN;
    END IF;
    ALTER ROLE querylayer_worker NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;

    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'querylayer_admin') THEN
        CREATE ROLE querylayer_admin NOLOGIN;
    END IF;
    ALTER ROLE querylayer_admin NOBYPASSRLS;
END
$roles$;

-- The schema named in the control file (querylayer) holds the tables and internal functions.
CREATE SCHEMA IF NOT EXISTS querylayer_api;
COMMENT ON SCHEMA querylayer IS 'QueryLayer tables and internal functions. Private: no role but the owner has any privilege here.';
COMMENT ON SCHEMA querylayer_api IS 'QueryLayer''s callable surface: SECURITY DEFINER functions for the edge, members and operators.';

REVOKE ALL ON SCHEMA querylayer FROM PUBLIC;
REVOKE ALL ON SCHEMA querylayer_api FROM PUBLIC;
GRANT USAGE ON SCHEMA querylayer TO querylayer_owner;
GRANT USAGE ON SCHEMA querylayer_api TO querylayer_owner, querylayer_edge, querylayer_worker, querylayer_admin;

-- The version of the extension's SQL objects in this database (ALTER EXTENSION … UPDATE moves it;
-- the shared library may be newer until then).
CREATE FUNCTION querylayer.installed_version() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'querylayer'
$$;
