-- One row per live prescription: patient, branch, physicians, claim totals, the latest
-- verification, and the days from prescription to delivery to first claim. A value not known
-- (a physician not found, no name) is NULL, never an empty string.
-- delivered_on is free text in the spec; where it starts with a date (alone or before a
-- time), that date as written is the delivery day: the clinic's day, whatever the offset
-- and whatever TimeZone the building session has.
-- One large join per step (MATERIALIZED): DuckDB holds every hash table of a pipeline at
-- once, so joining patients, claim totals and verifications in one pipeline needed memory
-- that grew with the data and failed under WAREHOUSE_MEMORY_LIMIT at scale 150; a step
-- with one large table spills (branches and physicians are small).
-- Incremental (macros/changed_records.sql): a night builds again the rows of the prescriptions
-- a change touched (`touched`, kept by its pre-hook, which deleted their rows).
WITH
{% if is_incremental() %}
touched AS (SELECT id FROM {{ touched_table() }}),
{% endif %}
claim_totals AS (
    SELECT
        prescription_id,
        count(*) AS claims,
        sum(total_claim_amount) AS total_claim_amount,
        sum(total_claim_paid) AS total_claim_paid,
        sum(total_claim_balance) AS total_claim_balance,
        sum(total_pt_responsibility_amount) AS total_pt_responsibility_amount,
        sum(total_pt_responsibility_balance) AS total_pt_responsibility_balance,
        min(date_of_service) AS first_claim_date
    FROM {{ source('clinical', 'claims') }}
    WHERE _deleted_at IS NULL
    {% if is_incremental() %} AND prescription_id IN (SELECT id FROM touched) {% endif %}
    GROUP BY prescription_id
),
latest_verification AS (
    SELECT prescription_id, id, verified_on, current_coverage, network_type, pre_auth_necessary
    FROM {{ source('clinical', 'insurance_verifications') }}
    WHERE _deleted_at IS NULL
    {% if is_incremental() %} AND prescription_id IN (SELECT id FROM touched) {% endif %}
    QUALIFY row_number() OVER (
        PARTITION BY prescription_id ORDER BY verified_on DESC NULLS LAST, id DESC
    ) = 1
),
with_patient AS MATERIALIZED (
    SELECT
        p.*,
        pt.first_name AS patient_first_name,
        pt.last_name AS patient_last_name,
        CASE
            WHEN regexp_matches(p.delivered_on, '^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ]|$)')
                THEN try_cast(left(p.delivered_on, 10) AS DATE)
        END AS delivered_date
    FROM {{ source('clinical', 'prescriptions') }} AS p
    LEFT JOIN {{ source('clinical', 'patients') }} AS pt
        ON pt.id = p.patient_id AND pt._deleted_at IS NULL
    WHERE p._deleted_at IS NULL
    {% if is_incremental() %} AND p.id IN (SELECT id FROM touched) {% endif %}
),
with_claims AS MATERIALIZED (
    SELECT p.*, ct.* EXCLUDE (prescription_id)
    FROM with_patient AS p
    LEFT JOIN claim_totals AS ct ON ct.prescription_id = p.id
),
with_verification AS MATERIALIZED (
    SELECT
        p.*,
        lv.id AS latest_verification_id,
        lv.verified_on AS latest_verified_on,
        lv.current_coverage AS latest_current_coverage,
        lv.network_type AS latest_network_type,
        lv.pre_auth_necessary AS latest_pre_auth_necessary
    FROM with_claims AS p
    LEFT JOIN latest_verification AS lv ON lv.prescription_id = p.id
)
SELECT
    p.id AS prescription_id,
    p.prescription_date,
    p.category,
    p.active,
    p.patient_id,
    p.patient_first_name,
    p.patient_last_name,
    p.branch_id,
    b.name AS branch_name,
    p.referring_physician_id,
    nullif(concat_ws(' ', rp.first_name, rp.last_name), '') AS referring_physician,
    p.primary_care_physician_id,
    nullif(concat_ws(' ', pcp.first_name, pcp.last_name), '') AS primary_care_physician,
    coalesce(p.claims, 0) AS claims,
    coalesce(p.total_claim_amount, 0) AS total_claim_amount,
    coalesce(p.total_claim_paid, 0) AS total_claim_paid,
    coalesce(p.total_claim_balance, 0) AS total_claim_balance,
    coalesce(p.total_pt_responsibility_amount, 0) AS total_pt_responsibility_amount,
    coalesce(p.total_pt_responsibility_balance, 0) AS total_pt_responsibility_balance,
    p.latest_verification_id,
    p.latest_verified_on,
    p.latest_current_coverage,
    p.latest_network_type,
    p.latest_pre_auth_necessary,
    p.delivered_date,
    p.first_claim_date,
    p.delivered_date - p.prescription_date AS days_prescription_to_delivery,
    p.first_claim_date - p.delivered_date AS days_delivery_to_first_claim,
    p.first_claim_date - p.prescription_date AS days_prescription_to_first_claim
FROM with_verification AS p
LEFT JOIN {{ source('clinical', 'branches') }} AS b
    ON b.id = p.branch_id AND b._deleted_at IS NULL
LEFT JOIN {{ source('clinical', 'physicians') }} AS rp
    ON rp.id = p.referring_physician_id AND rp._deleted_at IS NULL
LEFT JOIN {{ source('clinical', 'physicians') }} AS pcp
    ON pcp.id = p.primary_care_physician_id AND pcp._deleted_at IS NULL
