-- Issue 22: one Hermes stored session, one Agent Console conversation, across every site and
-- organization. A session belongs to its Hermes profile and a profile_id names one agent, so the
-- key is (profile_id, session_id). 0.1.0 keyed it on (site, session): a session registered on
-- two sites there had two conversations, which 0.2.0 cannot keep; such a database is named here
-- and left at 0.1.0 rather than have one of the two conversations silently chosen.
DO $check$
DECLARE
    v_duplicates text;
BEGIN
    SELECT string_agg(format('session %s of profile %s (%s sites)', d.session_id, d.profile_id, d.n), '; ')
      INTO v_duplicates
      FROM (SELECT profile_id, session_id, count(*) AS n FROM querylayer.agent_sessions
             GROUP BY profile_id, session_id HAVING count(*) > 1) d;
    IF v_duplicates IS NOT NULL THEN
        RAISE EXCEPTION 'querylayer 0.2.0 keeps one Hermes session to one conversation, and these are registered on more than one site: %',
            v_duplicates USING ERRCODE = 'QL409',
            HINT = 'the database stays at 0.1.0; decide with the sites concerned which conversation keeps each session';
    END IF;
END
$check$;

ALTER TABLE querylayer.agent_sessions ADD UNIQUE (profile_id, session_id);
ALTER TABLE querylayer.console_conversations ADD UNIQUE (profile_id, session_id);
