"""The numbers of a pull and of an ack item are checked in pydantic's compiled validator, not
in Python: a Python validator per field cost a batch ack item about a microsecond (issue 40).
What the checks accept and how their refusals read is tests/test_bad_input.py's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.api import schemas
from app.api.schemas.common import Body, parse
from app.domain.errors import InvalidInput


def _python_functions(schema: Any) -> list[str]:
    """The Python functions a core schema calls (validators), found anywhere in it."""
    found: list[str] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "metadata":
                continue  # JSON schema hooks: they run for the document, not per request
            if key == "function" and isinstance(value, dict):
                found.append(getattr(value.get("function"), "__name__", repr(value)))
            found.extend(_python_functions(value))
    elif isinstance(schema, list | tuple):
        for item in schema:
            found.extend(_python_functions(item))
    return found


def _field_schemas(model: type[BaseModel]) -> dict[str, Any]:
    schema: Any = model.__pydantic_core_schema__
    while schema.get("type") != "model":  # past the model's own validator
        schema = schema["schema"]
    fields: dict[str, Any] = schema["schema"]["fields"]
    return fields


@pytest.mark.parametrize(
    "model", [schemas.PullBody, schemas.AckBody, schemas.AckItem], ids=lambda m: m.__name__
)
def test_fields_have_no_python_validators(model: type[Body]) -> None:
    for name, field in _field_schemas(model).items():
        assert _python_functions(field) == [], name


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ('"x1"', "id must be a job id: a string of digits or an integer"),
        ('"0"', "id must be at least 1"),
        ("2.5", "id must be a whole number"),
        ("true", "id must be an integer"),
        ('"9999999999999999999"', "id must be at most 9223372036854775807"),
    ],
)
def test_the_first_of_many_refusals_is_the_one_said(given: str, reason: str) -> None:
    """Each branch of a gate (integer, number, string of digits) refuses a value of another
    type; the refusal said is the branch's for the value's type, in the value's place among
    the body's other errors (the same as when a Python validator checked it)."""
    body = '{"acks": [{"id": "1"}, {"id": ' + given + '}, {"id": "1", "attempt": "1"}]}'
    with pytest.raises(InvalidInput) as refused:
        parse(schemas.AcksBody, body.encode())
    assert str(refused.value) == reason


def test_gated_values_arrive_as_integers() -> None:
    body = b'{"acks": [{"id": "0007"}, {"id": 8.0, "attempt": 2.0}, {"id": 9, "attempt": 3}]}'
    acks = parse(schemas.AcksBody, body).acks
    assert [(a.id, a.attempt) for a in acks] == [(7, None), (8, 2), (9, 3)]
    assert all(type(a.id) is int for a in acks)
    assert all(type(a.attempt) is int for a in acks if a.attempt is not None)
