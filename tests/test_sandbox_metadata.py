"""The sandbox's self-description (spec 4.1): service document, `$metadata`, `openapi.json`.

Pure checks of what `connectors.sandbox.metadata` builds from the catalogue, then the served
documents over real HTTP, read by two independent consumers: openapi-spec-validator and
python-odata (which reflects entity classes from `$metadata` and pages through a set).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
import requests
from odata import ODataService
from openapi_spec_validator import validate

from connectors.clinical_records import catalogue as cat
from connectors.sandbox import metadata
from connectors.sandbox.server import SandboxServer
from tests.conftest import fetch_token

NS = {"edmx": metadata.EDMX_NS, "edm": metadata.EDM_NS}
CORE_DESCRIPTION = "Core.Description"


def parse(document: str) -> ET.Element:
    return ET.fromstring(document.encode())


def entity_types(root: ET.Element) -> dict[str, ET.Element]:
    schema = root.find("edmx:DataServices/edm:Schema", NS)
    assert schema is not None and schema.get("Namespace") == cat.NAMESPACE
    return {t.get("Name", ""): t for t in schema.findall("edm:EntityType", NS)}


def properties(entity_type: ET.Element) -> dict[str, ET.Element]:
    return {p.get("Name", ""): p for p in entity_type.findall("edm:Property", NS)}


def navigations(entity_type: ET.Element) -> dict[str, ET.Element]:
    return {n.get("Name", ""): n for n in entity_type.findall("edm:NavigationProperty", NS)}


def annotation(element: ET.Element, term: str) -> str | None:
    found = element.find(f"edm:Annotation[@Term='{term}']", NS)
    return None if found is None else found.get("String")


# -- the service document ----------------------------------------------------------------------


def test_service_document_lists_the_eight_sets():
    document = metadata.service_document("http://example.test/api")
    assert document["@odata.context"] == "http://example.test/api/$metadata"
    assert [item["name"] for item in document["value"]] == [e.name for e in cat.ENTITY_SETS]
    assert all(item["kind"] == "EntitySet" for item in document["value"])
    assert all(item["url"] == item["name"] for item in document["value"])


# -- $metadata ---------------------------------------------------------------------------------


def test_edmx_is_version_4_with_the_core_vocabulary():
    root = parse(metadata.edmx())
    assert root.tag == f"{{{metadata.EDMX_NS}}}Edmx"
    assert root.get("Version") == "4.0"
    include = root.find("edmx:Reference/edmx:Include", NS)
    assert include is not None
    assert (include.get("Namespace"), include.get("Alias")) == ("Org.OData.Core.V1", "Core")


@pytest.mark.parametrize("entity", cat.ALL_ENTITIES, ids=lambda e: e.type_name)
def test_every_catalogue_field_has_its_type_length_nullability_and_meaning(entity):
    found = entity_types(parse(metadata.edmx()))[entity.type_name]
    props = properties(found)
    assert list(props) == [f.name for f in entity.fields]
    for field in entity.fields:
        prop = props[field.name]
        assert prop.get("Type") == field.type.value, field.name
        expected_length = None if field.max_length is None else str(field.max_length)
        assert prop.get("MaxLength") == expected_length, field.name
        assert prop.get("Nullable") == ("false" if field.required else None), field.name
        assert annotation(prop, CORE_DESCRIPTION) == field.meaning, field.name
    keys = [ref.get("Name") for ref in found.findall("edm:Key/edm:PropertyRef", NS)]
    assert keys == [entity.key]


@pytest.mark.parametrize("entity", cat.ENTITY_SETS, ids=lambda e: e.type_name)
def test_navigation_properties_name_their_target_type(entity):
    found = navigations(entity_types(parse(metadata.edmx()))[entity.type_name])
    assert set(found) == {n.name for n in entity.navigations}
    for navigation in entity.navigations:
        target = f"{cat.NAMESPACE}.{navigation.target_set.type_name}"
        expected = f"Collection({target})" if navigation.many else target
        assert found[navigation.name].get("Type") == expected
        assert found[navigation.name].get("ContainsTarget") == (
            "true" if navigation.contained else None
        )


def test_patient_contains_its_documents():
    types = entity_types(parse(metadata.edmx()))
    documents = navigations(types[cat.PATIENTS.type_name])[cat.DOCUMENTS.name]
    assert documents.get("Type") == f"Collection({cat.DOCUMENTS.qualified_type})"
    assert documents.get("ContainsTarget") == "true"
    assert cat.DOCUMENTS.type_name in types


def test_referential_constraints_only_join_fields_of_one_type():
    types = entity_types(parse(metadata.edmx()))
    written = 0
    for entity in cat.ENTITY_SETS:
        for navigation in entity.navigations:
            nav = navigations(types[entity.type_name])[navigation.name]
            constraint = nav.find("edm:ReferentialConstraint", NS)
            target = navigation.target_set
            same_type = entity.field(navigation.local).type is target.field(navigation.remote).type
            assert (constraint is not None) == (same_type and not navigation.many)
            if constraint is not None:
                written += 1
                assert constraint.get("Property") == navigation.local
                assert constraint.get("ReferencedProperty") == navigation.remote
    # Prescription.Patient joins a number to a string: no constraint there.
    assert written >= 1
    patient = navigations(types[cat.PRESCRIPTIONS.type_name])["Patient"]
    assert patient.find("edm:ReferentialConstraint", NS) is None


def test_container_has_the_eight_sets_and_their_bindings():
    root = parse(metadata.edmx())
    container = root.find("edmx:DataServices/edm:Schema/edm:EntityContainer", NS)
    assert container is not None
    sets = {s.get("Name"): s for s in container.findall("edm:EntitySet", NS)}
    assert list(sets) == [e.name for e in cat.ENTITY_SETS]
    for entity in cat.ENTITY_SETS:
        element = sets[entity.name]
        assert element.get("EntityType") == entity.qualified_type
        bindings = {
            b.get("Path"): b.get("Target")
            for b in element.findall("edm:NavigationPropertyBinding", NS)
        }
        assert bindings == {n.name: n.target for n in entity.navigations if not n.contained}


def test_attribute_text_is_escaped():
    hostile = "a \"quoted\" <tag> & 'apostrophe'"
    text = metadata.element("Annotation", {"Term": CORE_DESCRIPTION, "String": hostile})
    assert ET.fromstring(text).get("String") == hostile


def test_edmx_is_built_once():
    assert metadata.edmx() is metadata.edmx()


# -- openapi.json ------------------------------------------------------------------------------


def test_openapi_is_valid_and_names_the_addresses():
    document = metadata.openapi("http://example.test/api", "http://example.test/auth")
    validate(document)
    assert document["openapi"] == "3.0.3"
    assert document["servers"] == [{"url": "http://example.test/api"}]
    flow = document["components"]["securitySchemes"]["oauth2"]["flows"]["clientCredentials"]
    assert flow["tokenUrl"] == "http://example.test/auth/oauth2/token"
    assert list(flow["scopes"]) == [f"{cat.SCOPE_PREFIX}{{customer}}"]
    api_key = document["components"]["securitySchemes"]["apiKey"]
    assert (api_key["in"], api_key["name"]) == ("header", "x-api-key")
    # Both schemes in one requirement: each request needs both.
    assert [set(r) for r in document["security"]] == [{"oauth2", "apiKey"}]


def test_openapi_paths_cover_every_route():
    paths = metadata.openapi("http://h/api", "http://h/auth")["paths"]
    expected = {"/", "/$metadata", "/openapi.json", "/document/{documentId}"}
    for entity in cat.ENTITY_SETS:
        expected |= {f"/{entity.name}", f"/{entity.name}({{id}})"}
    docs = "/Patients({id})/Documents"
    expected |= {docs, docs + "({documentId})", docs + "({documentId})/$value"}
    assert set(paths) == expected
    assert set(paths[docs]) == {"parameters", "get", "post"}
    assert set(paths[docs + "({documentId})"]) == {"parameters", "get", "delete"}
    assert "201" in paths[docs]["post"]["responses"]
    assert "413" in paths[docs]["post"]["responses"]
    assert "204" in paths[docs + "({documentId})"]["delete"]["responses"]


@pytest.mark.parametrize("entity", cat.ALL_ENTITIES, ids=lambda e: e.type_name)
def test_openapi_entity_schema_follows_the_catalogue(entity):
    schemas = metadata.openapi("http://h/api", "http://h/auth")["components"]["schemas"]
    props = schemas[entity.type_name]["properties"]
    expected_type = {
        cat.Edm.STRING: ("string", None),
        cat.Edm.INT32: ("integer", "int32"),
        cat.Edm.DECIMAL: ("string", "decimal"),
        cat.Edm.BOOLEAN: ("boolean", None),
        cat.Edm.DATE: ("string", "date"),
        cat.Edm.DATETIME: ("string", None),  # a pattern: RFC 3339 requires seconds
    }
    for field in entity.fields:
        prop = props[field.name]
        assert (prop["type"], prop.get("format")) == expected_type[field.type], field.name
        assert prop.get("maxLength") == field.max_length, field.name
        assert prop.get("nullable", False) is not field.required, field.name
    for navigation in entity.navigations:
        assert navigation.name in props
        assert (f"{navigation.name}@odata.count" in props) is navigation.many
    envelope = schemas[f"{entity.type_name}Collection"]
    assert envelope["properties"]["value"]["items"] == {
        "$ref": f"#/components/schemas/{entity.type_name}"
    }
    assert set(envelope["properties"]) == {"@odata.context", "@odata.count", "value"}


def test_openapi_query_options_bound_top_by_the_page_size():
    document = metadata.openapi("http://h/api", "http://h/auth")
    parameters = document["components"]["parameters"]
    assert {p["name"] for p in parameters.values()} == {
        "$filter",
        "$select",
        "$orderby",
        "$top",
        "$skip",
        "$count",
        "$expand",
    }
    assert parameters["top"]["schema"]["maximum"] == cat.PAGE_SIZE
    listed = document["paths"]["/Claims"]["get"]["parameters"]
    assert len(listed) == 7
    assert "$ref" in document["paths"]["/Claims"]["get"]["responses"]["400"]


# -- served over HTTP --------------------------------------------------------------------------


def auth_headers(server: SandboxServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {fetch_token(server)}", "x-api-key": server.config.api_key}


@pytest.fixture(scope="module")
def odata_session(sandbox: SandboxServer) -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.headers.update(auth_headers(sandbox))
        yield session


@pytest.mark.integration
def test_served_openapi_validates(sandbox, api):
    response = api.get("openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    document = response.json()
    validate(document)
    assert document["servers"] == [{"url": sandbox.base_url}]
    flows = document["components"]["securitySchemes"]["oauth2"]["flows"]
    assert flows["clientCredentials"]["tokenUrl"] == f"{sandbox.auth_url}/oauth2/token"


@pytest.mark.integration
def test_served_metadata_is_the_edmx(api):
    response = api.get("$metadata")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/xml")
    assert response.text == metadata.edmx()
    types = entity_types(parse(response.text))
    assert set(types) == {e.type_name for e in cat.ALL_ENTITIES}


@pytest.mark.integration
def test_served_service_document_points_at_live_sets(sandbox, api):
    response = api.get("")
    assert response.status_code == 200
    document = response.json()
    assert document["@odata.context"] == f"{sandbox.base_url}/$metadata"
    for item in document["value"]:
        page = api.get(item["url"], params={"$top": "1"})
        assert page.status_code == 200, item["name"]
        assert page.json()["@odata.context"].endswith(f"/$metadata#{item['name']}")


@pytest.mark.integration
def test_descriptions_need_credentials(sandbox):
    for path in ("", "/$metadata", "/openapi.json"):
        response = requests.get(sandbox.base_url + path, timeout=30)
        assert response.status_code == 401, path


@pytest.mark.integration
def test_python_odata_reflects_every_entity_set(sandbox, odata_session):
    service = ODataService(
        sandbox.base_url, reflect_entities=True, session=odata_session, quiet_progress=True
    )
    assert set(service.entities) == {e.name for e in cat.ENTITY_SETS}
    for entity in cat.ENTITY_SETS:
        reflected = service.entities[entity.name]
        assert reflected.__odata_collection__ == entity.name
        for field in entity.fields:
            assert hasattr(reflected, field.name), (entity.name, field.name)
        for navigation in entity.navigations:
            assert hasattr(reflected, navigation.name), (entity.name, navigation.name)


@pytest.mark.integration
def test_python_odata_pages_through_a_set(sandbox, odata_session, api):
    service = ODataService(
        sandbox.base_url, reflect_entities=True, session=odata_session, quiet_progress=True
    )
    Branch = service.entities[cat.BRANCHES.name]
    query = service.query(Branch).order_by(Branch.id.asc())
    first = query.limit(3).all()
    second = query.offset(3).limit(3).all()
    ids = [b.id for b in first + second]
    expected = api.get(
        cat.BRANCHES.name, params={"$orderby": "id asc", "$top": "6", "$select": "id"}
    ).json()["value"]
    assert ids == [row["id"] for row in expected]
    assert len(set(ids)) == len(ids) >= 4
    assert all(isinstance(i, int) for i in ids)
    # A filter built by the library is understood by the sandbox.
    one = service.query(Branch).filter(Branch.id == ids[1]).all()
    assert [b.id for b in one] == [ids[1]]
    assert one[0].name == first[1].name
