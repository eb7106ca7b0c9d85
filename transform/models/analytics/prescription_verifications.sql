-- Prescriptions with their insurance verifications: coverage, network, pre-authorisation.
-- Incremental (macros/changed_records.sql): a night inserts again the rows of the
-- verifications and prescriptions that changed, after its pre-hook deleted them.
SELECT
    p.id AS prescription_id,
    p.patient_id,
    p.prescription_date,
    v.id AS verification_id,
    v.verified,
    v.verified_on,
    v.effective_date,
    v.expiration_date,
    v.termination_date,
    v.current_coverage,
    v.carrier_type,
    v.network_type,
    v.benefits_payable,
    v.deductible_amount,
    v.amount_met,
    v.out_of_pocket_amount,
    v.out_of_pocket_remaining,
    v.pre_auth_necessary,
    v.pre_auth_notes,
    v.authorization_date,
    v.referral_needed
FROM {{ source('clinical', 'prescriptions') }} AS p
JOIN (
    -- the rows to build filtered before the join, which DuckDB does not do for a filter
    -- with subqueries written after it (it joined every row, then filtered)
    SELECT * FROM {{ source('clinical', 'insurance_verifications') }} AS v
    WHERE v._deleted_at IS NULL
    {% if is_incremental() %}
        AND (v.id IN {{ changed_ids('InsuranceVerifications', 'BIGINT') }}
            OR v.prescription_id IN {{ changed_ids('Prescriptions', 'VARCHAR') }})
    {% endif %}
) AS v ON v.prescription_id = p.id
WHERE p._deleted_at IS NULL
