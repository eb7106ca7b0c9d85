-- Live records whose parent is missing (never sent, or soft-deleted): the source has them.
-- One row per broken reference; ids as text so that every kind fits one column.
WITH live_prescriptions AS (
    SELECT id FROM clinical.prescriptions WHERE _deleted_at IS NULL
),
live_patients AS (
    SELECT id FROM clinical.patients WHERE _deleted_at IS NULL
),
live_branches AS (
    SELECT id FROM clinical.branches WHERE _deleted_at IS NULL
),
live_appointment_types AS (
    SELECT id FROM clinical.appointment_types WHERE _deleted_at IS NULL
)
SELECT 'Claims' AS entity, c.id::VARCHAR AS record_id, 'prescription_id' AS reference,
       'Prescriptions' AS parent_entity, c.prescription_id::VARCHAR AS parent_id
FROM clinical.claims AS c
WHERE c._deleted_at IS NULL AND c.prescription_id IS NOT NULL
  AND c.prescription_id NOT IN (SELECT id FROM live_prescriptions)
UNION ALL
SELECT 'Claims', c.id::VARCHAR, 'billing_branch_id', 'Branches', c.billing_branch_id::VARCHAR
FROM clinical.claims AS c
WHERE c._deleted_at IS NULL AND c.billing_branch_id IS NOT NULL
  AND c.billing_branch_id NOT IN (SELECT id FROM live_branches)
UNION ALL
SELECT 'InsuranceVerifications', v.id::VARCHAR, 'prescription_id', 'Prescriptions',
       v.prescription_id::VARCHAR
FROM clinical.insurance_verifications AS v
WHERE v._deleted_at IS NULL AND v.prescription_id IS NOT NULL
  AND v.prescription_id NOT IN (SELECT id FROM live_prescriptions)
UNION ALL
SELECT 'Appointments', a.id, 'patient_id', 'Patients', a.patient_id::VARCHAR
FROM clinical.appointments AS a
WHERE a._deleted_at IS NULL AND a.patient_id IS NOT NULL
  AND a.patient_id NOT IN (SELECT id FROM live_patients)
UNION ALL
SELECT 'Appointments', a.id, 'prescription_id', 'Prescriptions', a.prescription_id::VARCHAR
FROM clinical.appointments AS a
WHERE a._deleted_at IS NULL AND a.prescription_id IS NOT NULL
  AND a.prescription_id NOT IN (SELECT id FROM live_prescriptions)
UNION ALL
SELECT 'Appointments', a.id, 'appointment_type_id', 'AppointmentTypes', a.appointment_type_id
FROM clinical.appointments AS a
WHERE a._deleted_at IS NULL AND a.appointment_type_id IS NOT NULL
  AND a.appointment_type_id NOT IN (SELECT id FROM live_appointment_types);
