-- Issue 22: every list takes a limit and an opaque cursor (keyset paging) and answers one page
-- with `next_cursor`. The lists whose parameters changed are dropped here; 0.2.0 creates them
-- again with their new parameters (CREATE OR REPLACE cannot add parameters).
DROP FUNCTION IF EXISTS querylayer_api.list_runs(integer, timestamptz);
DROP FUNCTION IF EXISTS querylayer_api.list_content(text, integer);
DROP FUNCTION IF EXISTS querylayer.list_proposals(text, integer);
DROP FUNCTION IF EXISTS querylayer_api.list_proposals(text, integer);
DROP FUNCTION IF EXISTS querylayer_api.console_list_proposals(text, integer);
DROP FUNCTION IF EXISTS querylayer_api.console_list_connections();
DROP FUNCTION IF EXISTS querylayer_api.console_list_conversations();
DROP FUNCTION IF EXISTS querylayer_api.list_topical_map();
DROP FUNCTION IF EXISTS querylayer_api.list_topical_strategy_opportunities(text, integer);
DROP FUNCTION IF EXISTS querylayer_api.list_content_briefs(integer);
DROP FUNCTION IF EXISTS querylayer_api.list_content_source_packages(integer);
DROP FUNCTION IF EXISTS querylayer_api.list_content_source_records(uuid, boolean);
DROP FUNCTION IF EXISTS querylayer_api.list_evidence(uuid, uuid);
DROP FUNCTION IF EXISTS querylayer_api.list_evidence_reverification(uuid);
DROP FUNCTION IF EXISTS querylayer_api.console_list_evidence_reviews(text);
