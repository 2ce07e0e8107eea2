-- Issue 12: binding a did:key takes a proof of possession, so the functions that bind gain a
-- trailing p_did_proof parameter. CREATE OR REPLACE cannot change a parameter list (it would add
-- an overload), so the 0.1.0 signatures go first.
DROP FUNCTION querylayer.issue_connection(uuid, uuid, text, text[], timestamptz, text, text, text, boolean);
DROP FUNCTION querylayer_api.create_connection(text, text, text, text[], timestamptz, text, text, boolean);
DROP FUNCTION querylayer_api.console_create_connection(text, text, text[], timestamptz, text, text);
