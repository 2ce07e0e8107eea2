-- Issue 16: a connection's verdict at authentication is one statement in the extension
-- (RESOLVE_CONNECTION, extension/src/context.rs), no longer a plpgsql function called at every
-- tool call. The 0.3.0 library never calls the function, so it goes.
DROP FUNCTION querylayer.resolve_connection(uuid);
