-- Issue 14: begin_run takes a deadline (p_deadline_seconds); its 0.1.0 signature goes first.
DROP FUNCTION IF EXISTS querylayer_api.begin_run(text, jsonb, text[], text[]);
