-- Issue 14: every run ends (sql/060_runs.sql). Runs still open at the upgrade get the default
-- deadline counted from now, so the worker closes none of them by surprise.
CREATE TABLE querylayer.run_deadlines (
    run_id      uuid PRIMARY KEY REFERENCES querylayer.runs ON DELETE RESTRICT,
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    deadline_at timestamptz NOT NULL
);
CREATE INDEX run_deadlines_due ON querylayer.run_deadlines (site_id, deadline_at);
SELECT querylayer.isolate_by_site('querylayer.run_deadlines'::regclass);
SELECT querylayer.make_append_only('querylayer.run_deadlines'::regclass);

CREATE TABLE querylayer.run_deadline_sweeps (
    site_id      uuid PRIMARY KEY REFERENCES querylayer.sites ON DELETE RESTRICT,
    swept_until  timestamptz NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.run_deadline_sweeps'::regclass);

INSERT INTO querylayer.run_deadlines (run_id, site_id, deadline_at)
SELECT r.id, r.site_id, now() + make_interval(secs => 86400)
  FROM querylayer.runs r
 WHERE NOT EXISTS (SELECT 1 FROM querylayer.run_events e WHERE e.run_id = r.id AND e.kind = 'finished');
ALTER TABLE querylayer.run_deadlines OWNER TO querylayer_owner;
ALTER TABLE querylayer.run_deadline_sweeps OWNER TO querylayer_owner;
