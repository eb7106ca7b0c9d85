"""The entity catalogue: the one declarative description of the service's resources.

Everything downstream derives from it: the sandbox's `$metadata`, `openapi.json` and data
generator, the connector's query validation, the Arrow schemas, the DuckDB DDL (with the
meanings as comments), the incremental strategy and the Dagster asset factory.
Adding a field is one `f(...)` line in the entity's field list.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property


class Edm(StrEnum):
    """The spec's OData types (section 2, type notes)."""

    STRING = "Edm.String"
    INT32 = "Edm.Int32"
    DECIMAL = "Edm.Decimal"
    BOOLEAN = "Edm.Boolean"
    DATE = "Edm.Date"
    DATETIME = "Edm.DateTimeOffset"


# The words the spec's field tables use for each type.
SPEC_TYPE_WORDS: dict[str, Edm] = {
    "string": Edm.STRING,
    "number": Edm.INT32,
    "decimal": Edm.DECIMAL,
    "boolean": Edm.BOOLEAN,
    "date": Edm.DATE,
    "string (date-time)": Edm.DATETIME,
}


class Canonical(StrEnum):
    """Warehouse types (docs/ARCHITECTURE.md, Canonical types); values are DuckDB type names."""

    VARCHAR = "VARCHAR"
    BIGINT = "BIGINT"
    DECIMAL = "DECIMAL(38,12)"
    BOOLEAN = "BOOLEAN"
    DATE = "DATE"
    TIMESTAMPTZ = "TIMESTAMPTZ"
    TIME = "TIME"


# DuckDB's widest exact decimal: 26 digits before the point, 12 after. Money needs 2 to 4
# after it; 12 keep rates and the spec's unbounded "decimal text" exact, and 26 before it
# hold any amount. A value with more digits is kept raw, never rounded (warehouse/converters.py).
DECIMAL_PRECISION = 38
DECIMAL_SCALE = 12

CANONICAL_BY_EDM: dict[Edm, Canonical] = {
    Edm.STRING: Canonical.VARCHAR,
    Edm.INT32: Canonical.BIGINT,
    Edm.DECIMAL: Canonical.DECIMAL,
    Edm.BOOLEAN: Canonical.BOOLEAN,
    Edm.DATE: Canonical.DATE,
    Edm.DATETIME: Canonical.TIMESTAMPTZ,
}


class Strategy(StrEnum):
    """How an entity set is kept in step with the source (docs/ARCHITECTURE.md, Incremental sync)."""

    CURSOR = "cursor"  # `cursor ge watermark - lookback`, merged by key
    CREATED = "created"  # new rows by creation cursor; periodic full snapshot catches updates
    SNAPSHOT = "snapshot"  # full snapshot every run (small sets); finds hard deletes
    PERIODIC_SNAPSHOT = "periodic_snapshot"  # no cursor at all: a full snapshot on a cadence
    PER_PATIENT = "per_patient"  # documents: listed per patient by upload time


@dataclass(frozen=True)
class Field:
    """One property of an entity type, as the spec states it."""

    name: str
    type: Edm
    max_length: int | None
    meaning: str
    key: str | None = None  # logical key family of an id field ("patient", "branch", ...)
    parse_as: Canonical | None = None  # a plain string whose format the spec states exactly

    @property
    def required(self) -> bool:
        return self.name == "id" or "(required)" in self.meaning

    @property
    def canonical(self) -> Canonical:
        """Warehouse type: the logical-key rule first, then any stated format, then the EDM type."""
        if self.key is not None:
            return Canonical.BIGINT if self.key in BIGINT_KEYS else Canonical.VARCHAR
        if self.parse_as is not None:
            return self.parse_as
        return CANONICAL_BY_EDM[self.type]


@dataclass(frozen=True)
class Navigation:
    """A navigation property: `local` on this entity matches `remote` on the target set.

    A contained navigation (`ContainsTarget`) reaches entities that have no entity set of
    their own (Patients -> Documents): no binding, no reference check, no table of its own.
    """

    name: str
    target: str
    many: bool
    local: str
    remote: str
    contained: bool = False

    @property
    def target_set(self) -> EntitySet:
        """The target's catalogue entry; a contained target is not in `BY_NAME`."""
        return ALL_BY_NAME[self.target]


@dataclass(frozen=True)
class EntitySet:
    """An entity set of the service (or the Document type contained in Patients)."""

    name: str
    type_name: str
    table: str
    fields: tuple[Field, ...]
    strategy: Strategy
    cursor: str | None = None
    navigations: tuple[Navigation, ...] = ()
    key: str = "id"
    contained_in: str | None = None  # Documents live under /Patients({id})/Documents
    # Navigations whose records ride in this set's pages (`$expand` with a nested `$count`):
    # one request carries a hundred parents and all their children (docs/ARCHITECTURE.md).
    packs: tuple[str, ...] = ()

    @cached_property
    def by_name(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields}

    @cached_property
    def navigation(self) -> dict[str, Navigation]:
        return {n.name: n for n in self.navigations}

    def field(self, name: str) -> Field:
        return self.by_name[name]

    @property
    def key_field(self) -> Field:
        return self.by_name[self.key]

    @property
    def qualified_type(self) -> str:
        return f"{NAMESPACE}.{self.type_name}"

    @cached_property
    def change_cursor(self) -> str | None:
        """The field a write moves, which reconciliation re-reads by: `updated_at` shows
        inserts and updates, `created_at` inserts only; a set with neither shows neither.
        Only a date or a date-time: the service orders a string as text, and a string whose
        format the spec does not state (Prescriptions.created_at: date-only, offset-less or
        with any offset) does not order in time, so `ge <mark>` would pass over new writes."""
        return next(
            (
                name
                for name in CHANGE_CURSORS
                if name in self.by_name and self.by_name[name].type in TIME_TYPES
            ),
            None,
        )

    @property
    def sees_updates(self) -> bool:
        return self.change_cursor == "updated_at"


NAMESPACE = "ClinicalRecords"
CHANGE_CURSORS = ("updated_at", "created_at")  # most telling first
TIME_TYPES = frozenset({Edm.DATE, Edm.DATETIME})  # what the service orders in time

STRING, NUMBER, DECIMAL, BOOLEAN, DATE, DATETIME = (
    Edm.STRING,
    Edm.INT32,
    Edm.DECIMAL,
    Edm.BOOLEAN,
    Edm.DATE,
    Edm.DATETIME,
)


def f(
    name: str,
    type_: Edm,
    max_or_meaning: int | str,
    meaning: str | None = None,
    *,
    key: str | None = None,
    parse_as: Canonical | None = None,
) -> Field:
    """Compact field row: `f(name, TYPE, [max,] meaning, key=..., parse_as=...)`."""
    if meaning is None:
        assert isinstance(max_or_meaning, str)
        return Field(name, type_, None, max_or_meaning, key, parse_as)
    assert isinstance(max_or_meaning, int)
    return Field(name, type_, max_or_meaning, meaning, key, parse_as)


def nav(
    name: str, target: str, local: str, remote: str, many: bool = False, contained: bool = False
) -> Navigation:
    return Navigation(name, target, many, local, remote, contained)


PATIENTS = EntitySet(
    name="Patients",
    type_name="Patient",
    table="patients",
    strategy=Strategy.CREATED,
    cursor="created_at",
    fields=(
        f("id", STRING, "Unique patient identifier (required)", key="patient"),
        f("version", STRING, "Record version"),
        f("active", BOOLEAN, "Patient is active"),
        f("first_name", STRING, 25, "Name parts"),
        f("middle_name", STRING, 25, "Name parts"),
        f("last_name", STRING, 25, "Name parts"),
        f("nickname", STRING, 25, "Preferred name"),
        f("dob", STRING, "Date of birth"),
        f("gender", STRING, 10, "Gender"),
        f("email", STRING, 40, "Email address"),
        f("cell_phone", STRING, 15, "Phone numbers"),
        f("home_phone", STRING, 15, "Phone numbers"),
        f("work_phone", STRING, 15, "Phone numbers"),
        f("preferred_phone", STRING, 25, "Preferred contact phone type"),
        f("street_address", STRING, 100, "Primary address lines"),
        f("street_address_line2", STRING, 100, "Primary address lines"),
        f("city", STRING, 30, "City"),
        f("county", STRING, 255, "County"),
        f("state", STRING, 2, "State abbreviation"),
        f("zipcode", STRING, 10, "ZIP code"),
        f("country", STRING, 75, "Country"),
        f("address_label", STRING, 100, "Label of primary address"),
        f("street_address2", STRING, 100, "Secondary address lines"),
        f("street_address2_line2", STRING, 100, "Secondary address lines"),
        f("city2", STRING, 30, "Secondary city"),
        f("county2", STRING, 255, "Secondary county"),
        f("state2", STRING, 2, "Secondary state"),
        f("zipcode2", STRING, 10, "Secondary ZIP code"),
        f("country2", STRING, 75, "Secondary country"),
        f("address_label2", STRING, 100, "Label of secondary address"),
        f("marital_status", STRING, 20, "Marital status"),
        f("employment_status", STRING, 30, "Employment status"),
        f("living_situation", STRING, 30, "Living situation"),
        f("deceased", BOOLEAN, "Patient is deceased"),
        f("confirmation_opt_in", BOOLEAN, "Opted in to appointment confirmations"),
        f("spanish_text", BOOLEAN, "Prefers Spanish communications"),
        f("sms_compliant_cell", BOOLEAN, "Cell number is SMS compliant"),
        f("sms_cell_error_code", STRING, 25, "SMS error code"),
        f("critical_message", STRING, "Critical message flag"),
        f("manual_hipaa_signed_date", STRING, "Date the privacy form was manually signed"),
        f("primary_branch_id", STRING, "Primary branch", key="branch"),
        f("primary_practitioner_id", STRING, "Primary practitioner", key="user"),
        f("primary_caregiver_id", STRING, "Primary caregiver", key="caregiver"),
        f("patient_guarantor_id", STRING, "Guarantor", key="guarantor"),
        f("hospital_patient_id", STRING, 50, "Hospital system patient ID"),
        f("integrated_clinic_patient", BOOLEAN, "Linked to an integrated clinic system"),
        f("username", STRING, 25, "Patient portal username"),
        f("source_id", STRING, "Source system record ID"),
        f("source_display_id", STRING, 25, "Display ID in source system"),
        f("source_name", STRING, 100, "Source system name"),
        f("source_system", STRING, 100, "Source system identifier"),
        f("created_at", DATETIME, "Creation timestamp (required)"),
        f("created_by_id", STRING, "Creating user ID", key="user"),
    ),
    navigations=(
        nav("Appointments", "Appointments", "id", "patient_id", many=True),
        nav("Documents", "Documents", "id", "patient_id", many=True, contained=True),
    ),
    packs=("Appointments", "Documents"),
)

APPOINTMENTS = EntitySet(
    name="Appointments",
    type_name="Appointment",
    table="appointments",
    strategy=Strategy.CURSOR,
    cursor="updated_at",
    fields=(
        f("id", STRING, "Unique appointment identifier (required)", key="appointment"),
        f("patient_id", STRING, "Patient", key="patient"),
        f("appointment_date", STRING, "Date, YYYY-MM-DD", parse_as=Canonical.DATE),
        f("start_time", STRING, 8, "Time, HH:MM:SS", parse_as=Canonical.TIME),
        f("end_time", STRING, 8, "Time, HH:MM:SS", parse_as=Canonical.TIME),
        f("start_time_new", STRING, 8, "Alternate start and end time"),
        f("end_time_new", STRING, 8, "Alternate start and end time"),
        f("start_datetime", DATETIME, "Full start and end, ISO 8601"),
        f("end_datetime", DATETIME, "Full start and end, ISO 8601"),
        f("status", STRING, 30, "Appointment status (see section 3)"),
        f("visit_type", STRING, 30, "Visit type, for example In-Person or Telehealth"),
        f("appointment_type_id", STRING, "Appointment type", key="appointment_type"),
        f("branch_id", STRING, "Branch or location", key="branch"),
        f("user_id", STRING, "Primary clinician", key="user"),
        f("user_two_id", STRING, "Secondary, tertiary, quaternary clinician", key="user"),
        f("user_three_id", STRING, "Secondary, tertiary, quaternary clinician", key="user"),
        f("user_four_id", STRING, "Secondary, tertiary, quaternary clinician", key="user"),
        f("user_type", STRING, 30, "Type of primary user"),
        f("user_type_id", STRING, "User type identifier", key="user_type"),
        f("notes", STRING, "Notes"),
        f("prescription_id", STRING, "Associated prescriptions", key="prescription"),
        f("prescription_two_id", STRING, "Associated prescriptions", key="prescription"),
        f("recurring", BOOLEAN, "Part of a recurring series"),
        f("recurring_appointment_id", STRING, "Recurring series ID", key="recurring_series"),
        f("custom_recurrence", BOOLEAN, "Recurrence is custom-defined"),
        f("rescheduled_from", STRING, "Original appointment ID if rescheduled", key="appointment"),
        f("rescheduled_to", STRING, "New appointment ID if rescheduled", key="appointment"),
        f("confirmation_code", STRING, 100, "Confirmation code"),
        f("confirmation_sent", BOOLEAN, "A confirmation was sent"),
        f(
            "confirmation_status",
            STRING,
            45,
            "Confirmation status, for example Confirmed or Pending",
        ),
        f("confirmation_updated_at", DATETIME, "Last change of confirmation status"),
        f("confirmation_request_sent_date", STRING, "Date the confirmation request was sent"),
        f("confirmation_request_sent_status", STRING, 25, "Status of the confirmation request"),
        f("survey_sent_date", STRING, "Date the post-visit survey was sent"),
        f("survey_sent_status", STRING, 25, "Survey delivery status"),
        f("survey_completed", BOOLEAN, "Survey completed"),
        f("delivery_location_id", STRING, "Delivery location", key="delivery_location"),
        f("calendar_event_id", STRING, 300, "Associated external calendar event ID"),
        f("source_id", STRING, "Source system record ID"),
        f("source_name", STRING, 100, "Source system name"),
        f("created_at", DATETIME, "Timestamps"),
        f("updated_at", DATETIME, "Timestamps"),
        f("created_by_id", STRING, "Creating and updating user", key="user"),
        f("updated_by_id", STRING, "Creating and updating user", key="user"),
    ),
    navigations=(
        nav("AppointmentTypes", "AppointmentTypes", "appointment_type_id", "id"),
        nav("Patients", "Patients", "patient_id", "id"),
    ),
)

APPOINTMENT_TYPES = EntitySet(
    name="AppointmentTypes",
    type_name="AppointmentType",
    table="appointment_types",
    strategy=Strategy.SNAPSHOT,
    fields=(
        f("id", STRING, "Unique identifier (required)", key="appointment_type"),
        f("name", STRING, 50, "Display name"),
        f("duration", STRING, "Default duration in minutes"),
        f("active", BOOLEAN, "Currently in use"),
        f("color", STRING, 10, "Hex colour code for calendar display"),
        f("survey_link", STRING, 255, "URL of post-visit survey"),
        f(
            "appointment_type_status_id",
            STRING,
            "Associated status configuration",
            key="appointment_type_status",
        ),
        f("source_id", STRING, "Source system record ID"),
        f("source_name", STRING, 100, "Source system name"),
        f("created_at", DATETIME, "Timestamps"),
        f("updated_at", DATETIME, "Timestamps"),
    ),
)

BRANCHES = EntitySet(
    name="Branches",
    type_name="Branch",
    table="branches",
    strategy=Strategy.SNAPSHOT,
    fields=(
        f("id", NUMBER, "Unique identifier (required)", key="branch"),
        f("name", STRING, 100, "Branch name (required)"),
        f("active", BOOLEAN, "Branch is active"),
        f("code", STRING, 3, "Short code"),
        f("city", STRING, 30, "City"),
        f("state", STRING, 2, "State abbreviation"),
        f("zipcode", STRING, 10, "ZIP code"),
        f("street_address", STRING, 100, "Street address"),
        f("country", STRING, 50, "Country"),
        f("phone_number", STRING, 25, "Phone and fax"),
        f("fax_number", STRING, 25, "Phone and fax"),
        f("npi", STRING, 15, "National provider identifier"),
        f("tax_id", STRING, 40, "Tax ID"),
        f("tax_id_type", STRING, 40, "Tax ID type"),
        f("timezone", STRING, 32, "Timezone identifier"),
        f("parent_id", NUMBER, "Parent branch ID", key="branch"),
        f("billing_company_name", STRING, 100, "Billing company name"),
        f("billing_street_address", STRING, 100, "Billing street"),
        f("billing_city", STRING, 30, "Billing city"),
        f("billing_state", STRING, 2, "Billing state"),
        f("billing_zipcode", STRING, 30, "Billing ZIP"),
        f("billing_npi", STRING, 15, "Billing NPI"),
        f("billing_phone_number", STRING, 25, "Billing phone and fax"),
        f("billing_fax_number", STRING, 25, "Billing phone and fax"),
        f("billing_email", STRING, 250, "Billing email"),
        f("shipping_street_address", STRING, 100, "Shipping street"),
        f("shipping_city", STRING, 30, "Shipping city"),
        f("shipping_state", STRING, 2, "Shipping state"),
        f("shipping_zipcode", STRING, 10, "Shipping ZIP"),
        f("shipping_country", STRING, 50, "Shipping country"),
        f("source_id", NUMBER, "Source system record ID"),
        f("source_name", STRING, 100, "Source system name"),
    ),
    navigations=(
        nav("Parent", "Branches", "parent_id", "id"),
        nav("Children", "Branches", "id", "parent_id", many=True),
        nav("Appointments", "Appointments", "id", "branch_id", many=True),
        nav("BillingClaims", "Claims", "id", "billing_branch_id", many=True),
        nav("Patients", "Patients", "id", "primary_branch_id", many=True),
        nav("Prescriptions", "Prescriptions", "id", "branch_id", many=True),
    ),
)

PHYSICIANS = EntitySet(
    name="Physicians",
    type_name="Physician",
    table="physicians",
    strategy=Strategy.SNAPSHOT,
    fields=(
        f("id", STRING, "Unique identifier (required)", key="physician"),
        f("active", BOOLEAN, "Record is active"),
        f("first_name", STRING, 25, "Name parts"),
        f("middle_name", STRING, 25, "Name parts"),
        f("last_name", STRING, 25, "Name parts"),
        f("suffix", STRING, 5, "Name suffix"),
        f("credentials", STRING, 20, "Professional credentials"),
        f("email", STRING, 40, "Email address"),
        f("npi", STRING, 15, "National provider identifier"),
        f("upin", STRING, 15, "Unique physician identification number"),
        f("license_number", STRING, 15, "State licence number"),
        f("medicaid_number", STRING, 15, "Medicaid provider number"),
        f("taxonomy_code", STRING, 45, "Provider taxonomy code"),
        f("pecos_verified", BOOLEAN, "Verified in the federal provider enrolment system"),
        f("verified_on", STRING, "Date of that verification"),
        f("other_id1", STRING, 15, "Additional identifiers"),
        f("other_id2", STRING, 15, "Additional identifiers"),
        f("street_address", STRING, 100, "Office street"),
        f("city", STRING, 30, "City"),
        f("state", STRING, 2, "State abbreviation"),
        f("zipcode", STRING, 10, "ZIP code"),
        f("hospital_facility", STRING, 255, "Associated hospital or facility"),
        f("notes", STRING, "General notes"),
        f("alert_message", STRING, 500, "Alert message for staff"),
        f("source_id", STRING, "Source system record ID"),
        f("source_name", STRING, 100, "Source system name"),
    ),
)

PRESCRIPTIONS = EntitySet(
    name="Prescriptions",
    type_name="Prescription",
    table="prescriptions",
    strategy=Strategy.CREATED,
    cursor="created_at",
    fields=(
        f("id", NUMBER, "Unique identifier (required)", key="prescription"),
        f("patient_id", NUMBER, "Patient (required)", key="patient"),
        f("active", BOOLEAN, "Active"),
        f("archived", BOOLEAN, "Archived"),
        f("branch_id", NUMBER, "Branch", key="branch"),
        f("prescription_date", DATE, "Date of prescription"),
        f("category", STRING, "Category"),
        f("sub_category", STRING, "Subcategory"),
        f("referring_physician_id", NUMBER, "Referring physician", key="physician"),
        f("primary_care_physician_id", NUMBER, "Primary care physician", key="physician"),
        f("face_to_face_exam_date", DATE, "Face-to-face exam date"),
        f("surgery_date", DATE, "Surgery date"),
        f("k_level", STRING, "K-level classification"),
        f("fabrication_due_date", DATE, "Fabrication due date"),
        f("fabrication_start_date", DATE, "Fabrication start date"),
        f("fabrication_completed", BOOLEAN, "Fabrication complete"),
        f("fabrication_completed_date", DATE, "Fabrication completion date"),
        f("projected_delivery_date", DATE, "Projected delivery date"),
        f("delivered_on", STRING, "Actual delivery date/time (may be null)"),
        f("delivery_location", STRING, "Delivery location description"),
        f("signed_date", DATE, "Date signed"),
        f("note", STRING, "General note"),
        f("comments", STRING, "Additional comments"),
        f("source_id", NUMBER, "Source system record ID"),
        f("source_name", STRING, "Source system name"),
        f("created_at", STRING, "Date/time created"),  # no format stated: the text as sent
    ),
    navigations=(
        nav("Patient", "Patients", "patient_id", "id"),
        nav("ReferringPhysician", "Physicians", "referring_physician_id", "id"),
        nav("PrimaryCarePhysician", "Physicians", "primary_care_physician_id", "id"),
        nav("Branch", "Branches", "branch_id", "id"),
        nav("Appointments", "Appointments", "id", "prescription_id", many=True),
        nav("Claims", "Claims", "id", "prescription_id", many=True),
        nav("InsuranceVerifications", "InsuranceVerifications", "id", "prescription_id", many=True),
    ),
    packs=("Claims", "InsuranceVerifications"),
)

CLAIMS = EntitySet(
    name="Claims",
    type_name="Claim",
    table="claims",
    strategy=Strategy.CURSOR,
    cursor="updated_at",
    fields=(
        f("id", NUMBER, "Unique identifier (required)", key="claim"),
        f("prescription_id", NUMBER, "Associated prescription", key="prescription"),
        f("billing_branch_id", NUMBER, "Billing branch", key="branch"),
        f("date_of_service", DATE, "Date of service"),
        f("total_claim_amount", DECIMAL, "Total amount"),
        f("total_claim_balance", DECIMAL, "Remaining balance"),
        f("total_claim_paid", DECIMAL, "Amount paid"),
        f("total_pt_responsibility_amount", DECIMAL, "Total patient responsibility"),
        f("total_pt_responsibility_balance", DECIMAL, "Patient responsibility balance"),
        f("total_pt_responsibility_paid", DECIMAL, "Patient responsibility paid"),
        f("uncollected", DECIMAL, "Uncollected amount"),
        f("date_resolved", DATE, "Date resolved"),
        f("accept_assignment", BOOLEAN, "Assignment accepted"),
        f("payment_plan", BOOLEAN, "On a payment plan"),
        f("svc_rcm", BOOLEAN, "Managed through the service's revenue cycle management"),
        f("additional_info", STRING, "Additional information"),
        f("created_at", DATE, "Date created"),
        f("updated_at", DATE, "Date last updated"),
    ),
    navigations=(
        nav("Prescription", "Prescriptions", "prescription_id", "id"),
        nav("BillingBranch", "Branches", "billing_branch_id", "id"),
    ),
)

INSURANCE_VERIFICATIONS = EntitySet(
    name="InsuranceVerifications",
    type_name="InsuranceVerification",
    table="insurance_verifications",
    strategy=Strategy.PERIODIC_SNAPSHOT,
    fields=(
        f("id", NUMBER, "Unique identifier (required)", key="verification"),
        f("prescription_id", NUMBER, "Associated prescription", key="prescription"),
        f("patient_insurance_id", NUMBER, "Patient insurance record", key="patient_insurance"),
        f("verified", BOOLEAN, "Verification complete"),
        f("verified_on", DATE, "Date verified"),
        f("verified_by_id", NUMBER, "Verifying user", key="user"),
        f("effective_date", DATE, "Coverage effective date"),
        f("expiration_date", DATE, "Coverage expiration date"),
        f("termination_date", DATE, "Coverage termination date"),
        f("current_coverage", BOOLEAN, "Coverage is current"),
        f("carrier_type", STRING, "Carrier type"),
        f("network_type", STRING, "Network type, for example IN or OUT"),
        f("benefits_payable", STRING, "Benefits payable indicator"),
        f("deductible_amount", DECIMAL, "Deductible"),
        f("amount_met", DECIMAL, "Deductible met"),
        f("out_of_pocket_amount", DECIMAL, "Out-of-pocket maximum"),
        f("out_of_pocket_remaining", DECIMAL, "Out-of-pocket remaining"),
        f("annual_max", STRING, "Annual benefit maximum"),
        f("life_time_max", STRING, "Lifetime benefit maximum"),
        f("pre_auth_necessary", BOOLEAN, "Prior authorisation required"),
        f("pre_auth_notes", STRING, "Prior authorisation notes"),
        f("pre_auth_phone", STRING, "Prior authorisation phone"),
        f("referral_needed", BOOLEAN, "Referral needed"),
        f("referral_number", STRING, "Referral number"),
        f("authorization_date", DATE, "Authorisation date"),
        f("notes", STRING, "General notes"),
        f("source_id", NUMBER, "Source system record ID"),
        f("source_name", STRING, "Source system name"),
    ),
    navigations=(nav("Prescription", "Prescriptions", "prescription_id", "id"),),
)

DOCUMENTS = EntitySet(
    name="Documents",
    type_name="Document",
    table="patient_documents",
    strategy=Strategy.PER_PATIENT,
    cursor="uploaded_at",
    contained_in="Patients",
    fields=(
        f("id", STRING, "Unique document ID", key="document"),
        f("patient_id", STRING, "Owning patient", key="patient"),
        f("file_name", STRING, "File name"),
        f("content_type", STRING, "MIME type"),
        f("file_size_bytes", NUMBER, "Size in bytes"),
        f("document_type", STRING, "Category label (optional)"),
        f("description", STRING, "Human-readable description (optional)"),
        f("uploaded_by_id", STRING, "Uploading user", key="user"),
        f("uploaded_at", DATETIME, "Upload time, ISO 8601"),
    ),
)

# The eight read-only entity sets, in the order of spec section 2.
ENTITY_SETS: tuple[EntitySet, ...] = (
    PATIENTS,
    APPOINTMENTS,
    APPOINTMENT_TYPES,
    BRANCHES,
    PHYSICIANS,
    PRESCRIPTIONS,
    CLAIMS,
    INSURANCE_VERIFICATIONS,
)
ALL_ENTITIES: tuple[EntitySet, ...] = (*ENTITY_SETS, DOCUMENTS)

# Key families the service sends as a number somewhere: their ids are digits (the sandbox
# makes them so; a number sent for one is held as its decimal text).
NUMERIC_KEYS: frozenset[str] = frozenset(
    fld.key for ent in ALL_ENTITIES for fld in ent.fields if fld.key and fld.type is Edm.INT32
)
# The typing rule (docs/ARCHITECTURE.md, Canonical types): a family is BIGINT only where the
# spec types every member field, in every set, as a number; any string member makes every
# member VARCHAR, the string as sent, so "00123" and "123" stay two ids and a user name or a
# location code stays what it is. One type per family: joins need no casts.
BIGINT_KEYS: frozenset[str] = NUMERIC_KEYS - frozenset(
    fld.key for ent in ALL_ENTITIES for fld in ent.fields if fld.key and fld.type is not Edm.INT32
)

BY_NAME: dict[str, EntitySet] = {e.name: e for e in ENTITY_SETS}
ALL_BY_NAME: dict[str, EntitySet] = {e.name: e for e in ALL_ENTITIES}
BY_TABLE: dict[str, EntitySet] = {e.table: e for e in ALL_ENTITIES}

# Child set -> (the parent whose pages carry it, the navigation that reaches it).
RIDES_WITH: dict[str, tuple[EntitySet, Navigation]] = {
    parent.navigation[name].target: (parent, parent.navigation[name])
    for parent in ENTITY_SETS
    for name in parent.packs
}
# One extraction per family: a set and the sets that ride in its pages, in spec order.
FAMILIES: tuple[tuple[EntitySet, ...], ...] = tuple(
    (root, *(ALL_BY_NAME[root.navigation[name].target] for name in root.packs))
    for root in ENTITY_SETS
    if root.name not in RIDES_WITH
)

# Spec 4.3: accepted document types, and the upload size limit of spec 8.
ACCEPTED_DOCUMENT_TYPES: dict[str, str] = {
    "application/pdf": "PDF",
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/tiff": "TIFF",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "DOCX",
}
MAX_UPLOAD_BYTES = 25 * 1024 * 1024
PAGE_SIZE = 100
MAX_EXPAND_DEPTH = 3
TOKEN_LIFETIME_SECONDS = 300
SCOPE_PREFIX = "svc-customer-api/"


def partition_of(target: EntitySet) -> tuple[EntitySet, Navigation] | None:
    """A small set (read whole every run) with a navigation to `target`'s records: one
    request to it counts them per parent (`$expand=<nav>($count=true;$top=0)`), cells that
    reconciliation searches apart (sync/reconcile.py)."""
    for small in ENTITY_SETS:
        if small.strategy is not Strategy.SNAPSHOT or small is target:
            continue
        for navigation in small.navigations:
            if navigation.many and not navigation.contained and navigation.target == target.name:
                return small, navigation
    return None


def entity(name: str) -> EntitySet:
    """Find an entity set by the spec's name or its table name, case-insensitively."""
    wanted = name.strip().lower()
    for ent in ALL_ENTITIES:
        if wanted in (ent.name.lower(), ent.table):
            return ent
    known = ", ".join(e.name for e in ALL_ENTITIES)
    raise KeyError(f"unknown entity set {name!r}; expected one of: {known}")
