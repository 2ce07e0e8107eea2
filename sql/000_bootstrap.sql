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
-- Install-time guards. CREATE EXTENSION silently adopts an existing schema named in the control
-- file (querylayer), with its owner, privileges and contents: a tenant who owns the database
-- could plant functions there for the install (which runs as a superuser) or the runtime to call.
-- So the install refuses unless querylayer is the installer's own, empty and ungranted (as
-- CREATE EXTENSION makes it), and querylayer_api does not exist yet (it is created below). The
-- checks name every catalog, type and operator by schema: nothing in the adopted schema can
-- answer for them.
DO $guard$
DECLARE
    v_extension oid;
    v_installer oid;
    v_schema    record;
BEGIN
    -- Agents' text, JSON and the hashes and signatures over them are UTF-8 throughout (the
    -- extension reads strings as UTF-8; the edge speaks UTF-8): another encoding would turn the
    -- first non-ASCII character into an error, or into bytes counted and hashed as other text.
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8'::pg_catalog.name THEN
        RAISE EXCEPTION 'querylayer needs a UTF8 database; database % is encoded %',
            pg_catalog.quote_ident(pg_catalog.current_database()), pg_catalog.getdatabaseencoding()
            USING ERRCODE = '0A000',
                  HINT = 'install into a database made with ENCODING ''UTF8'' (for example CREATE DATABASE '
                         '... ENCODING ''UTF8'' LOCALE ''C.UTF-8'' TEMPLATE template0)';
    END IF;
    SELECT e.oid, e.extowner INTO v_extension, v_installer
      FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'querylayer'::pg_catalog.name;
    SELECT n.oid, n.nspowner, n.nspacl INTO v_schema
      FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'querylayer'::pg_catalog.name;
    IF v_schema.nspowner OPERATOR(pg_catalog.<>) v_installer THEN
        RAISE EXCEPTION 'schema querylayer already exists and belongs to role %, not to the installing role',
            pg_catalog.pg_get_userbyid(v_schema.nspowner)
            USING ERRCODE = '42P06',
                  HINT = 'CREATE EXTENSION querylayer makes its own schema; drop or rename the existing one first';
    END IF;
    IF v_schema.nspacl IS NOT NULL
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_default_acl a
                   WHERE a.defaclnamespace OPERATOR(pg_catalog.=) v_schema.oid) THEN
        RAISE EXCEPTION 'schema querylayer already exists with privileges granted on it'
            USING ERRCODE = '42P06',
                  HINT = 'CREATE EXTENSION querylayer makes its own schema; drop or rename the existing one first';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
                  AND d.refobjid OPERATOR(pg_catalog.=) v_schema.oid
                  AND NOT (d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                           AND d.objid OPERATOR(pg_catalog.=) v_extension))
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) v_schema.oid)
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) v_schema.oid)
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_type t WHERE t.typnamespace OPERATOR(pg_catalog.=) v_schema.oid)
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) v_schema.oid) THEN
        RAISE EXCEPTION 'schema querylayer already exists and is not empty'
            USING ERRCODE = '42P06',
                  HINT = 'CREATE EXTENSION querylayer makes its own schema; drop or rename the existing one first';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n
                WHERE n.nspname OPERATOR(pg_catalog.=) 'querylayer_api'::pg_catalog.name) THEN
        RAISE EXCEPTION 'schema querylayer_api already exists'
            USING ERRCODE = '42P06',
                  HINT = 'CREATE EXTENSION querylayer makes its own schema; drop or rename the existing one first';
    END IF;
END
$guard$;

DO $roles$
BEGIN
    -- Two databases installing at once would update the same role rows ("tuple concurrently
    -- updated"): installs take turns here, cluster-wide (the shared catalogs' own locks).
    LOCK TABLE pg_catalog.pg_authid, pg_catalog.pg_db_role_setting IN SHARE ROW EXCLUSIVE MODE;
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

    -- The owner role exists to own, never to act: no role may hold it (a member could act as
    -- the owner of every table and function).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                WHERE m.roleid OPERATOR(pg_catalog.=) 'querylayer_owner'::pg_catalog.regrole) THEN
        RAISE EXCEPTION 'role querylayer_owner has members: %',
            (SELECT pg_catalog.string_agg(pg_catalog.pg_get_userbyid(m.member), ', ')
               FROM pg_catalog.pg_auth_members m WHERE m.roleid OPERATOR(pg_catalog.=) 'querylayer_owner'::pg_catalog.regrole)
            USING ERRCODE = '42501', HINT = 'REVOKE querylayer_owner FROM each of them, then install';
    END IF;

    -- Runtime hygiene for the runtime roles: no statement runs for ever, and a transaction left
    -- open (holding a request context and its locks) ends by itself. The edge also sets its own
    -- statement_timeout per connection (querylayer serve --statement-timeout), which wins.
    ALTER ROLE querylayer_edge SET statement_timeout = '30s';
    ALTER ROLE querylayer_edge SET idle_in_transaction_session_timeout = '60s';
    ALTER ROLE querylayer_worker SET statement_timeout = '60s';
    ALTER ROLE querylayer_worker SET idle_in_transaction_session_timeout = '60s';
END
$roles$;

-- The schema named in the control file (querylayer) holds the tables and internal functions;
-- querylayer_api is made here, so it is the extension's own (the guard above refused an old one).
CREATE SCHEMA querylayer_api;
COMMENT ON SCHEMA querylayer IS 'QueryLayer tables and internal functions. Private: no role but the owner has any privilege here.';
COMMENT ON SCHEMA querylayer_api IS 'QueryLayer''s callable surface: SECURITY DEFINER functions for the edge, members and operators.';

REVOKE ALL ON SCHEMA querylayer FROM PUBLIC;
REVOKE ALL ON SCHEMA querylayer_api FROM PUBLIC;
GRANT USAGE ON SCHEMA querylayer TO querylayer_owner;
GRANT USAGE ON SCHEMA querylayer_api TO querylayer_owner, querylayer_edge, querylayer_worker, querylayer_admin;

-- The version of the extension's SQL objects in this database (ALTER EXTENSION … UPDATE moves it;
-- the shared library may be newer until then).
CREATE FUNCTION querylayer.installed_version() RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'querylayer');
END
$$;
