-- 0.2.0: verifiable history (sql/185_checkpoints.sql, docs/ledger.md): the live state's chained
-- events (the signed checkpoints' table is made first, 19-checkpoints.pre.sql). A 0.1.0 database kept its live pointers and
-- topical map without events, so the upgrade appends one baseline event per published or
-- archived item, topic and topic page to each site's chain: from here on, the live state is the
-- replay of its events. (The chain only grows: every record 0.1.0 wrote keeps its hash.)

CREATE TABLE querylayer.state_events (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    -- content_item (its id), topic (its id), topic_page ('<topic_id>/<content_id>').
    subject     text NOT NULL CHECK (subject IN ('content_item', 'topic', 'topic_page')),
    subject_id  text NOT NULL,
    -- The subject's state after the change (querylayer.live_state); NULL when it is gone.
    state       jsonb,
    -- decision: an approved decision executing (decision_id); operator: an operator function
    -- (actor); baseline: the state an upgrade found, before events were kept.
    cause       text NOT NULL CHECK (cause IN ('decision', 'operator', 'baseline')),
    decision_id uuid REFERENCES querylayer.proposal_decisions ON DELETE RESTRICT,
    actor       text,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((cause = 'decision') = (decision_id IS NOT NULL))
);
SELECT querylayer.isolate_by_site('querylayer.state_events'::regclass);
SELECT querylayer.make_chained('querylayer.state_events'::regclass);
CREATE INDEX state_events_subject ON querylayer.state_events (site_id, subject, subject_id, chain_seq);

SELECT querylayer.record_state_baseline('upgrade to 0.2.0'::text);
