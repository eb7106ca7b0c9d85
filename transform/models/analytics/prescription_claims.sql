-- Prescriptions with their claims: one row per claim, money as exact DECIMAL(38,12).
-- Incremental (macros/changed_records.sql): a night inserts again the rows of the claims and
-- prescriptions that changed, after its pre-hook deleted them.
-- Joins need no casts: a prescription id has one type in every table (VARCHAR, as sent).
SELECT
    p.id AS prescription_id,
    p.patient_id,
    p.branch_id,
    p.prescription_date,
    p.category,
    c.id AS claim_id,
    c.billing_branch_id,
    c.date_of_service,
    c.total_claim_amount,
    c.total_claim_paid,
    c.total_claim_balance,
    c.total_pt_responsibility_amount,
    c.total_pt_responsibility_paid,
    c.total_pt_responsibility_balance,
    c.uncollected,
    c.date_resolved,
    c.payment_plan
FROM {{ source('clinical', 'prescriptions') }} AS p
JOIN (
    -- the rows to build filtered before the join, which DuckDB does not do for a filter
    -- with subqueries written after it (it joined every row, then filtered)
    SELECT * FROM {{ source('clinical', 'claims') }} AS c
    WHERE c._deleted_at IS NULL
    {% if is_incremental() %}
        AND (c.id IN {{ changed_ids('Claims', 'BIGINT') }}
            OR c.prescription_id IN {{ changed_ids('Prescriptions', 'VARCHAR') }})
    {% endif %}
) AS c ON c.prescription_id = p.id
WHERE p._deleted_at IS NULL
