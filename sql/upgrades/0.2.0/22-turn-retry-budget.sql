-- Issue 22: the automatic retry budget belongs to the turn (two in all, across its steps and
-- plan versions; a member's re-open restores it), and a failed or cancelled plan ends its turn.
ALTER TABLE querylayer.console_turns
    ADD COLUMN retries_used integer NOT NULL DEFAULT 0 CHECK (retries_used BETWEEN 0 AND 2);

-- What 0.1.0 turns already spent (per step there), so an upgrade restores no budget.
UPDATE querylayer.console_turns t
   SET retries_used = least(2, s.spent)
  FROM (SELECT p.turn_id, sum(st.retry_count) AS spent
          FROM querylayer.task_plans p JOIN querylayer.task_steps st ON st.plan_id = p.id
         GROUP BY p.turn_id) s
 WHERE s.turn_id = t.id AND t.state = 'claimed' AND s.spent > 0;

-- A claimed turn whose current plan failed or was cancelled under 0.1.0 could be re-planned
-- there; in 0.2.0 it has ended (a member may re-open it).
UPDATE querylayer.console_turns t
   SET state = CASE p.state WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END, ended_at = now(),
       outcome = CASE p.state WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,
       failure_reason = coalesce(p.failure_reason, 'the plan ' || p.state)
  FROM (SELECT DISTINCT ON (turn_id) turn_id, state, failure_reason
          FROM querylayer.task_plans ORDER BY turn_id, version DESC) p
 WHERE p.turn_id = t.id AND t.state = 'claimed' AND p.state IN ('failed', 'cancelled');
