-- Issue 21: limits that hold across every edge, decided in the database (sql/157_rate.sql):
-- token buckets (UNLOGGED: not history), per-connection budgets and what their windows used.
-- Before the functions, whose SQL bodies read them; open_tool_call gained its rate parameters
-- (CREATE OR REPLACE cannot add a parameter).
CREATE UNLOGGED TABLE querylayer.rate_buckets (
    kind   text NOT NULL CHECK (kind IN ('connection', 'auth_failure', 'oauth_register')),
    key    text NOT NULL CHECK (length(key) <= 64),
    tokens double precision NOT NULL,
    at     timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE querylayer.connection_budgets (
    connection_id uuid NOT NULL REFERENCES querylayer.connections ON DELETE RESTRICT,
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    scope         text NOT NULL CHECK (scope = '*write' OR scope ~ '^[a-z-]+:[a-z]+$'),
    period        text NOT NULL CHECK (period IN ('hour', 'day')),
    max_calls     integer NOT NULL CHECK (max_calls BETWEEN 0 AND 100000000),
    set_by        text NOT NULL,
    set_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, scope, period)
);
ALTER TABLE querylayer.connection_budgets ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.connection_budgets FORCE ROW LEVEL SECURITY;
CREATE TABLE querylayer.connection_budget_use (
    connection_id uuid NOT NULL,
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    scope         text NOT NULL,
    period        text NOT NULL,
    window_start  timestamptz NOT NULL,
    used          integer NOT NULL DEFAULT 0,
    PRIMARY KEY (connection_id, scope, period, window_start)
);
ALTER TABLE querylayer.connection_budget_use ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.connection_budget_use FORCE ROW LEVEL SECURITY;
DROP FUNCTION querylayer_api.open_tool_call(bytea, text, text, bytea);
