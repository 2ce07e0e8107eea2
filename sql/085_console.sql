-- The edge's audit of MCP tool calls. The member console's functions live with their domains:
-- proposals in 080_proposals.sql, connections in 040_credentials.sql, did:key challenges in
-- 095_envelopes.sql.

-- One audit row per MCP tool call: who (from the context), which tool, outcome, duration.
-- Never argument values.
CREATE FUNCTION querylayer_api.record_tool_call(p_tool text, p_outcome text, p_duration_ms integer,
                                                p_error_code text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection(NULL::text);
    IF p_tool IS NULL OR p_tool !~ '^[a-z][a-z0-9_]{0,79}$' THEN
        RAISE EXCEPTION 'tool: a tool name is required' USING ERRCODE = '22023';
    END IF;
    IF p_outcome IS NULL OR p_outcome NOT IN ('ok', 'error') THEN
        RAISE EXCEPTION 'outcome must be ok or error' USING ERRCODE = '22023';
    END IF;
    IF p_error_code IS NOT NULL AND p_error_code !~ '^[a-z][a-z0-9_]{0,63}$' THEN
        RAISE EXCEPTION 'error_code: a short machine code is required' USING ERRCODE = '22023';
    END IF;
    PERFORM querylayer.audit('tool.call'::text, p_tool,
        jsonb_build_object('tool', p_tool, 'duration_ms', greatest(p_duration_ms, 0), 'error_code', p_error_code),
        p_outcome);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.record_tool_call TO querylayer_edge;
