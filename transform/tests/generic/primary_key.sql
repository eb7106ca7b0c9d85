{#- A key: every row has one, and no two rows the same (one test where dbt's `unique` and
    `not_null` are two: each test is a node dbt builds and a check Dagster records, every run). -#}
{% test primary_key(model, column_name) %}
SELECT {{ column_name }} AS key, count(*) AS rows
FROM {{ model }}
GROUP BY {{ column_name }}
HAVING count(*) > 1 OR {{ column_name }} IS NULL
{% endtest %}
