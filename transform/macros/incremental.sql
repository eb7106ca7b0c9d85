{#- An incremental model's night, in as few statements as it needs. dbt-duckdb's incremental
    materialization writes the rows into a temporary table, reads both tables' columns back
    (catalog queries, each turned into an agate table), widens types, inserts by the columns
    it found and drops the temporary table: Python, mostly, for rows that can go straight
    into the table (warehouse.models.build of one night's changes on a scale-2 warehouse a
    year old: 0.52 s against 0.46 with this one, medians of 15 builds).

    Here, when the table exists and is built from the changes (is_incremental(): the same SQL;
    warehouse/models.py builds it whole otherwise), the pre-hook deletes the rows of the
    records that changed and one INSERT ... BY NAME adds their rows again: a column the table
    lacks fails the build, never a silent drop. Anything else (a first or whole build, a
    unique key, another strategy or language, a schema change to follow, grants) is
    dbt-duckdb's own. A project that installs this one as a package keeps dbt-duckdb's (dbt
    lets only the root project override a built-in materialization). -#}
{% materialization incremental, adapter='duckdb' -%}
  {%- set existing = load_cached_relation(this) -%}
  {%- if existing is none or existing.is_view or should_full_refresh()
        or model['language'] != 'sql' or config.get('unique_key')
        or config.get('incremental_strategy') not in (none, 'append')
        or config.get('on_schema_change', 'ignore') != 'ignore'
        or config.get('grants') -%}
    {{ return(dbt.materialization_incremental_duckdb()) }}
  {%- endif -%}

  {%- set target = this.incorporate(type='table') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {{ run_hooks(pre_hooks, inside_transaction=True) }}
  {%- call statement('main') -%}
    INSERT INTO {{ target }} BY NAME (
    {{ compiled_code }}
    )
  {%- endcall -%}
  {% do persist_docs(target, model) %}
  {{ run_hooks(post_hooks, inside_transaction=True) }}
  {% do adapter.commit() %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{%- endmaterialization %}
