{#- Incremental models: a night rebuilds the rows of the records that changed since the model
    was last built, not the whole table, so that its cost follows the day's changes and not
    the years behind them (docs/SIZING.md, a year of nights).

    What changed is `analytics.changes` (every record a load inserted, updated or deleted)
    since the model's last good build (`ops.models`, written by warehouse/models.py). A model
    whose SQL, table or schema changed is built whole (`--full-refresh`, warehouse/models.py);
    one with no build on record reads every change ever made, which is a whole build too. -#}

{#- The ids of `entity` (the spec's set name) changed since this model's last build, as a
    subquery of `type`: the type of the column they are compared with (ids are kept as sent:
    text in one set, numbers in another). `since`: last_built() when the caller has it. -#}
{% macro changed_ids(entity, type, since=none) -%}
(SELECT TRY_CAST(changed.id AS {{ type }})
 FROM {{ warehouse_table('analytics', 'changes') }} AS changed
 WHERE changed.entity = '{{ entity }}' AND changed.synced_at > {{ since or last_built() }})
{%- endmacro %}

{#- Every record changed since this model's last build, as (entity, id as sent): for a model
    whose rows name records of several sets (broken_references). -#}
{% macro changed_records() -%}
(SELECT changed.entity, changed.id FROM {{ warehouse_table('analytics', 'changes') }} AS changed
 WHERE changed.synced_at > {{ last_built() }})
{%- endmacro %}

{#- When this model was last built, as a literal: a constant lets DuckDB skip the row groups
    of analytics.changes written before it (a subquery there read the whole table, which
    grows every night). -#}
{% macro last_built() -%}
{%- if execute -%}
{%- set found = run_query(
    "SELECT coalesce(CAST(max(built_at) AS VARCHAR), '-infinity') FROM "
    ~ warehouse_table('ops', 'models') ~ " WHERE name = '" ~ this.identifier ~ "'") -%}
'{{ found.columns[0].values()[0] }}'::TIMESTAMPTZ
{%- else -%}
'-infinity'::TIMESTAMPTZ
{%- endif -%}
{%- endmacro %}

{#- A table of the warehouse this model is built in, outside the dbt project's sources: its
    catalog is named after the file ("clinic-a"), which only a quoted name holds. -#}
{% macro warehouse_table(schema, name) -%}
{{ api.Relation.create(database=this.database, schema=schema, identifier=name) }}
{%- endmacro %}

{#- The pre-hook of an incremental model: before its SELECT inserts the rows of the records
    that changed, delete the rows it holds of them (`keys`: a column of the model -> the ids,
    a subquery, whose rows go). Nothing on a whole build. -#}
{% macro delete_changed_rows(keys) -%}
{%- if is_incremental() -%}
DELETE FROM {{ this }} WHERE
{%- for column, ids in keys.items() %} {{ column }} IN {{ ids }}{% if not loop.last %} OR{% endif %}
{%- endfor %}
{%- endif -%}
{%- endmacro %}

{#- The prescriptions whose row in prescription_summary a change can move: changed
    themselves, or their patient, branch or a physician; or a claim or verification of theirs,
    as it is now or as any version it replaced was (a claim moved to another prescription
    changes both rows). -#}
{% macro prescriptions_touched() -%}
{%- set since = last_built() -%}
(SELECT id FROM {{ changed_ids('Prescriptions', 'VARCHAR', since) }} AS p(id)
 UNION SELECT p.id FROM {{ source('clinical', 'prescriptions') }} AS p
     WHERE p.patient_id IN {{ changed_ids('Patients', 'VARCHAR', since) }}
        OR p.branch_id IN {{ changed_ids('Branches', 'VARCHAR', since) }}
        OR p.referring_physician_id IN {{ changed_ids('Physicians', 'VARCHAR', since) }}
        OR p.primary_care_physician_id IN {{ changed_ids('Physicians', 'VARCHAR', since) }}
 {%- for entity, table in [('Claims', 'claims'), ('InsuranceVerifications', 'insurance_verifications')] %}
 UNION SELECT prescription_id FROM {{ source('clinical', table) }}
     WHERE id IN {{ changed_ids(entity, 'BIGINT', since) }}
 UNION SELECT prescription_id FROM {{ warehouse_table('history', table ~ '_superseded') }}
     WHERE id IN {{ changed_ids(entity, 'BIGINT', since) }}
 {%- endfor %})
{%- endmacro %}

{#- prescription_summary's pre-hook: the prescriptions touched, kept for the night's build as a
    temporary table of this connection, so that the delete and the SELECT read it once and
    DuckDB plans their joins on its true size (a CTE of `prescriptions_touched()` was
    estimated at the size of the prescriptions, which put the small side of every join the
    wrong way round: 0.109 s against 0.061 on a year-old scale-10 warehouse). -#}
{% macro keep_prescriptions_touched() -%}
{%- if is_incremental() -%}
CREATE OR REPLACE TEMP TABLE {{ touched_table() }} AS
SELECT id FROM {{ prescriptions_touched() }} AS t(id)
{%- endif -%}
{%- endmacro %}

{% macro drop_prescriptions_touched() -%}
DROP TABLE IF EXISTS {{ touched_table() }}
{%- endmacro %}

{% macro touched_table() -%}
temp.main."prescriptions_touched"
{%- endmacro %}
