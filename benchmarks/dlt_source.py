"""dlt's `rest_api` source for the same eight entity sets: the tool we are measured against.

Configured as dlt's documentation shows, and no further: OAuth2 client credentials, the
`x-api-key` header, offset paging with `$top`/`$skip` and `@odata.count`, `$orderby=id asc`,
`data_selector="value"`, merge on `id`, and dlt's own incremental (`$filter=<cursor> ge
{incremental.start_value}`) on the two sets with an `updated_at` cursor; the others are read
in full every run. With `--documents`, patient documents too, listed per patient as a dlt
user would (a `resolve` parameter from the patients resource: one request per patient), into
`patient_documents`; left out by default, as the benchmarks that compare the eight sets need
it. Retries are dlt's defaults, and so is sequential extraction: `--parallel`
turns on dlt's documented `parallelized=True`, whose threads, against a 5 requests/s limit,
exhaust dlt's default retries on 429 so that the run fails.

Tokens: dlt 1.31's `OAuth2ClientCredentials` renews a token only once its own clock says it
expired, a clock started when the token's answer arrived (after the service started its),
with no margin; and dlt's retries (`requests.retry.Client`, tenacity around `Session.send`)
resend a request as first prepared, bearer token included. So a request sent in the last
milliseconds of a token's life, or a 429 retried after it, carries a token the service
has expired, and the 401 ends the run (dlt retries 429 and 5xx, not 401). None of its
documented settings changes that (`default_token_expiration` applies only when the answer
has no `expires_in`). Every expiry a run outlives is a chance to fail, near certain when it
is being throttled (scale 10 at 50 requests/s: a 401 after 3,560 requests and 302 s);
e2e_vs_dlt.py's sparse run (5/s, 300 ms latency) outlived three tokens. So
expansion_cost.py lengthens the sandbox's token lifetime for dlt's run.

Run in its own process so its peak RSS and CPU seconds are its own:
  python benchmarks/dlt_source.py --duckdb PATH --pipelines-dir DIR   (CLINICAL_* from the env)
The pipeline state (dlt's incremental cursors) lives in the pipelines dir: a second run with
the same dir is dlt's incremental run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.clinical_records.catalogue import (
    DOCUMENTS,
    ENTITY_SETS,
    PAGE_SIZE,
    PATIENTS,
    SCOPE_PREFIX,
    EntitySet,
    Strategy,
)
from sync.strategy import cursor_is_date

DATASET = "clinical"
PIPELINE = "clinical_records_dlt"

# dlt's incremental needs an initial value for the first run: earlier than any record.
INITIAL_VALUE = {True: "1970-01-01", False: "1970-01-01T00:00:00Z"}


def incremental_sets() -> tuple[EntitySet, ...]:
    """The sets dlt reads incrementally: those with an `updated_at`-style cursor."""
    return tuple(e for e in ENTITY_SETS if e.strategy is Strategy.CURSOR)


def _resource(entity: EntitySet) -> dict[str, Any]:
    params: dict[str, Any] = {"$orderby": f"{entity.key} asc", "$count": "true"}
    endpoint: dict[str, Any] = {"path": entity.name, "params": params}
    if entity in incremental_sets():
        assert entity.cursor is not None
        params["$filter"] = f"{entity.cursor} ge {{incremental.start_value}}"
        endpoint["incremental"] = {
            "cursor_path": entity.cursor,
            "initial_value": INITIAL_VALUE[cursor_is_date(entity)],
        }
    return {"name": entity.table, "endpoint": endpoint}


def _documents_resource() -> dict[str, Any]:
    """Patient documents: `Patients({id})/Documents` for every patient the patients resource
    yields (dlt's `resolve` parameter), paged like the sets."""
    patient_id = {"type": "resolve", "resource": PATIENTS.table, "field": PATIENTS.key}
    params = {"patient_id": patient_id, "$orderby": f"{DOCUMENTS.key} asc", "$count": "true"}
    path = f"{PATIENTS.name}({{patient_id}})/{DOCUMENTS.name}"
    return {"name": DOCUMENTS.table, "endpoint": {"path": path, "params": params}}


def rest_api_config(env: Mapping[str, str], documents: bool = False) -> dict[str, Any]:
    """The `RESTAPIConfig` for the eight entity sets (and, with `documents`, the patients'
    documents), from the CLINICAL_* settings."""
    from dlt.sources.helpers.rest_client.auth import OAuth2ClientCredentials
    from dlt.sources.helpers.rest_client.paginators import OffsetPaginator

    auth = OAuth2ClientCredentials(
        access_token_url=f"{env['CLINICAL_AUTH_URL']}/oauth2/token",
        client_id=env["CLINICAL_CLIENT_ID"],
        client_secret=env["CLINICAL_CLIENT_SECRET"],
        access_token_request_data={"scope": SCOPE_PREFIX + env["CLINICAL_CUSTOMER"]},
    )
    paginator = OffsetPaginator(
        limit=PAGE_SIZE,
        limit_param="$top",
        offset_param="$skip",
        total_path="['@odata.count']",  # quoted: '@' and '.' are jsonpath syntax
    )
    return {
        "client": {
            "base_url": env["CLINICAL_API_BASE_URL"] + "/",
            "auth": auth,
            "headers": {"x-api-key": env["CLINICAL_API_KEY"], "Accept": "application/json"},
            "paginator": paginator,
        },
        "resource_defaults": {
            "primary_key": "id",
            "write_disposition": "merge",
            "endpoint": {"data_selector": "value"},
        },
        "resources": [
            *(_resource(e) for e in ENTITY_SETS),
            *([_documents_resource()] if documents else []),
        ],
    }


def run(
    env: Mapping[str, str],
    duckdb_path: Path,
    pipelines_dir: Path,
    parallelized: bool = False,
    documents: bool = False,
) -> dict[str, Any]:
    """One dlt run (the first is full, later ones incremental); rows loaded per table."""
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")  # a benchmark must not call home
    import dlt
    from dlt.sources.rest_api import rest_api_source

    config = rest_api_config(env, documents=documents)
    source = rest_api_source(config, name=PIPELINE, parallelized=parallelized)
    pipeline = dlt.pipeline(
        pipeline_name=PIPELINE,
        pipelines_dir=str(pipelines_dir),
        destination=dlt.destinations.duckdb(str(duckdb_path)),
        dataset_name=DATASET,
    )
    started = time.perf_counter()
    pipeline.run(source)
    rows = pipeline.last_trace.last_normalize_info.row_counts
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "rows": {t: n for t, n in rows.items() if not t.startswith("_dlt")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duckdb", type=Path, required=True)
    parser.add_argument("--pipelines-dir", type=Path, required=True)
    parser.add_argument("--parallel", action="store_true", help="dlt's parallelized extraction")
    parser.add_argument(
        "--documents", action="store_true", help="also list every patient's documents"
    )
    args = parser.parse_args()
    summary = run(
        os.environ,
        args.duckdb,
        args.pipelines_dir,
        parallelized=args.parallel,
        documents=args.documents,
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
