-- How each entity set's last run ended: exact, or by how much it may differ from the source.
-- One row per entity set, from ops.set_results: `exact` when none of the set's checks of
-- severity ERROR failed, else the records by which it may differ (`unreconciled`) and the
-- checks that failed; the run's own row is in ops.sync_runs.
CREATE OR REPLACE VIEW analytics.sync_health AS
SELECT
    r.entity,
    r.exact,
    r.unreconciled,
    r.failed_checks,
    r.warned_checks,
    r.staleness_hours,
    r.live_rows,
    r.mode,
    r.run_id,
    r.recorded_at
FROM ops.set_results AS r
QUALIFY row_number() OVER (PARTITION BY r.entity ORDER BY r.recorded_at DESC) = 1;
