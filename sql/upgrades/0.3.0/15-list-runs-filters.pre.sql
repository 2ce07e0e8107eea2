-- Issue 15: list_runs takes p_status and p_agent (the MCP tool querylayer_list_runs). CREATE OR
-- REPLACE cannot add parameters, so the 0.2.0 function is dropped first and created again.
DROP FUNCTION IF EXISTS querylayer_api.list_runs(integer, timestamptz, text);
