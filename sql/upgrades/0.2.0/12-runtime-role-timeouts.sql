-- Issue 12: no statement of a runtime role runs for ever, and a transaction left open (holding
-- a request context and its credential's lock) ends by itself. Role settings are cluster-wide.
ALTER ROLE querylayer_edge SET statement_timeout = '30s';
ALTER ROLE querylayer_edge SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE querylayer_worker SET statement_timeout = '60s';
ALTER ROLE querylayer_worker SET idle_in_transaction_session_timeout = '60s';
