-- Issue 16: authenticate keeps a live connection's verdict while nothing it was decided from has
-- changed (sql/010_context.sql, "liveness generation"). The table starts empty; the triggers of
-- the tables that decide liveness (decides_liveness) are re-applied from the fresh install.
CREATE SEQUENCE querylayer.liveness_generations AS bigint;
CREATE TABLE querylayer.liveness_generation (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    generation bigint NOT NULL
);
ALTER SEQUENCE querylayer.liveness_generations OWNED BY querylayer.liveness_generation.generation;
