-- Generated from connectors/clinical_records/catalogue.py by `python -m warehouse.dbt_catalogue`; do not edit.
-- Live records whose parent is missing (never sent, or soft-deleted): the source has
-- them. One row per broken reference, of every reference the checks count; ids as
-- text, so that every kind fits one column. Incremental (macros/changed_records.sql):
-- a night builds again the rows of the records that changed and of their children.
{% if is_incremental() %}{% set since = last_built() %}{% endif %}
SELECT 'Appointments' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'appointment_type_id' AS reference, 'AppointmentTypes' AS parent_entity,
    CAST(s."appointment_type_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'appointments') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."appointment_type_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Appointments', 'VARCHAR', since) }} OR s."appointment_type_id" IN {{ changed_ids('AppointmentTypes', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'appointment_types') }} AS t
    WHERE t."id" = s."appointment_type_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Appointments' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'patient_id' AS reference, 'Patients' AS parent_entity,
    CAST(s."patient_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'appointments') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."patient_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Appointments', 'VARCHAR', since) }} OR s."patient_id" IN {{ changed_ids('Patients', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'patients') }} AS t
    WHERE t."id" = s."patient_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Branches' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'parent_id' AS reference, 'Branches' AS parent_entity,
    CAST(s."parent_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'branches') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."parent_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Branches', 'VARCHAR', since) }} OR s."parent_id" IN {{ changed_ids('Branches', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'branches') }} AS t
    WHERE t."id" = s."parent_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Prescriptions' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'patient_id' AS reference, 'Patients' AS parent_entity,
    CAST(s."patient_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'prescriptions') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."patient_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Prescriptions', 'VARCHAR', since) }} OR s."patient_id" IN {{ changed_ids('Patients', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'patients') }} AS t
    WHERE t."id" = s."patient_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Prescriptions' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'referring_physician_id' AS reference, 'Physicians' AS parent_entity,
    CAST(s."referring_physician_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'prescriptions') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."referring_physician_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Prescriptions', 'VARCHAR', since) }} OR s."referring_physician_id" IN {{ changed_ids('Physicians', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'physicians') }} AS t
    WHERE t."id" = s."referring_physician_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Prescriptions' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'primary_care_physician_id' AS reference, 'Physicians' AS parent_entity,
    CAST(s."primary_care_physician_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'prescriptions') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."primary_care_physician_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Prescriptions', 'VARCHAR', since) }} OR s."primary_care_physician_id" IN {{ changed_ids('Physicians', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'physicians') }} AS t
    WHERE t."id" = s."primary_care_physician_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Prescriptions' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'branch_id' AS reference, 'Branches' AS parent_entity,
    CAST(s."branch_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'prescriptions') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."branch_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Prescriptions', 'VARCHAR', since) }} OR s."branch_id" IN {{ changed_ids('Branches', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'branches') }} AS t
    WHERE t."id" = s."branch_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Claims' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'prescription_id' AS reference, 'Prescriptions' AS parent_entity,
    CAST(s."prescription_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'claims') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."prescription_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Claims', 'BIGINT', since) }} OR s."prescription_id" IN {{ changed_ids('Prescriptions', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'prescriptions') }} AS t
    WHERE t."id" = s."prescription_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'Claims' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'billing_branch_id' AS reference, 'Branches' AS parent_entity,
    CAST(s."billing_branch_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'claims') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."billing_branch_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('Claims', 'BIGINT', since) }} OR s."billing_branch_id" IN {{ changed_ids('Branches', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'branches') }} AS t
    WHERE t."id" = s."billing_branch_id" AND t."_deleted_at" IS NULL
)
UNION ALL
SELECT 'InsuranceVerifications' AS entity, CAST(s."id" AS VARCHAR) AS record_id,
    'prescription_id' AS reference, 'Prescriptions' AS parent_entity,
    CAST(s."prescription_id" AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{ source('clinical', 'insurance_verifications') }} AS s
    WHERE s."_deleted_at" IS NULL AND s."prescription_id" IS NOT NULL
    {% if is_incremental() %} AND (s."id" IN {{ changed_ids('InsuranceVerifications', 'BIGINT', since) }} OR s."prescription_id" IN {{ changed_ids('Prescriptions', 'VARCHAR', since) }}) {% endif %}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{ source('clinical', 'prescriptions') }} AS t
    WHERE t."id" = s."prescription_id" AND t."_deleted_at" IS NULL
)
