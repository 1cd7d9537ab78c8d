"""What every resource's schemas share: the field types a body may hold and how their refusals
read, reading a JSON body into its model, and the shapes every answer uses.

A request body is a pydantic model, validated from the bytes app/api/limits.py read (pydantic's
compiled validator parses and checks in one pass). A refusal is a 400 whose detail says what is
wrong in the broker's own words: each field type carries a `Says`, the refusals' texts by
pydantic error type, which `parse` uses to word the first error.

Answers are TypedDicts: the views build plain dicts (no model is made per request) that mypy
checks against them, and FastAPI generates the document's schemas from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import (
    Annotated,
    Any,
    ClassVar,
    Literal,
    NotRequired,
    TypeVar,
    get_args,
    get_origin,
)

from annotated_types import Ge, Le
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    ValidationError,
    WithJsonSchema,
)
from pydantic.fields import FieldInfo
from pydantic_core import core_schema
from typing_extensions import TypedDict  # pydantic's schemas need it before Python 3.12

from app.domain.errors import InvalidInput

# Column ranges: job ids are BIGINT; attempts and timeouts are INTEGER. A delay or timeout
# beyond MAX_INT32 seconds (68 years) would also push a lease past what timestamps hold.
MAX_ID = 2**63 - 1
MAX_INT32 = 2**31 - 1

Message = str | Callable[[Any], str]  # a template ({name}, {input!r}, the bounds) or a function


# Compared by identity: its messages are a dict, and Annotated metadata must hash.
@dataclass(frozen=True, slots=True, eq=False)
class Says:
    """How a field's refusals read, by pydantic error type ("*": any other)."""

    messages: Mapping[str, Message]

    def reason(self, kind: str, name: str, given: Any, bounds: Mapping[str, Any]) -> str:
        message = self.messages.get(kind) or self.messages.get("*")
        if message is None:
            return f"{name} is malformed"
        if callable(message):
            return message(given)
        return message.format(name=name, input=given, **bounds)


# A number gate's branches, named by the JSON type each takes (names no field has): a value
# of no branch's type is refused by the integer's.
INTEGER, NUMBER, STRING = "(integer)", "(number)", "(string)"


@dataclass(frozen=True, slots=True)
class JsonNumber:
    """JSON numbers only (10 or 10.0; with `digits`, also a string that matches it), checked
    in pydantic's compiled validator: its lax integers would take "10" and true too, and a
    Python validator cost an ack item's id three calls (the bounds ran in Python behind it).

    Put after the field's bounds: they stay in the integer's own schema (and the document's),
    checked once the gate let the value through as an int."""

    digits: str | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        bounded = handler(source)
        branches: list[Any] = [
            (core_schema.int_schema(strict=True), INTEGER),
            (
                core_schema.chain_schema(
                    [core_schema.float_schema(strict=True), core_schema.int_schema()]
                ),
                NUMBER,
            ),
        ]
        if self.digits is not None:
            text = core_schema.str_schema(strict=True, pattern=self.digits)
            branches.insert(0, (core_schema.chain_schema([text, core_schema.int_schema()]), STRING))
        gate = core_schema.union_schema(branches, mode="left_to_right")
        # The bounds' schema's description and examples are the field's: the chain carries them.
        return core_schema.chain_schema([gate, bounded], metadata=bounded.get("metadata"))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> Any:
        return handler(schema["steps"][-1])  # the bounded integer's


def _branch_of(given: Any) -> str:
    if isinstance(given, str):
        return STRING
    return NUMBER if isinstance(given, float) else INTEGER


def _gated(errors: list[Any]) -> list[Any]:
    """Errors with each gate's branches in one: the error of the branch for the given value's
    JSON type (the integer's when no branch takes that type), placed at the field."""
    out: list[Any] = []
    gates: dict[tuple[Any, ...], dict[str, Any]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        if not loc or loc[-1] not in (INTEGER, NUMBER, STRING):
            out.append(error)
        elif loc[:-1] not in gates:
            gates[loc[:-1]] = {loc[-1]: error}
            out.append(loc[:-1])  # the gate's place in the order
        else:
            gates[loc[:-1]][loc[-1]] = error
    for i, item in enumerate(out):
        if isinstance(item, tuple):
            branches = gates[item]
            given = next(iter(branches.values()))["input"]
            chosen = branches.get(_branch_of(given)) or branches[INTEGER]
            out[i] = {**chosen, "loc": item}
    return out


WHOLE = Says(
    {
        "int_type": "{name} must be an integer",
        "int_from_float": "{name} must be a whole number",
        "greater_than_equal": "{name} must be at least {ge}",
        "less_than_equal": "{name} must be at most {le}",
        "int_parsing_size": "{name} must be at most {le}",  # a float past any integer (1e300)
    }
)
SECONDS = Says(
    {
        "float_type": "{name} must be a number of seconds",
        "finite_number": "{name} must be a finite number of seconds",
        "greater_than_equal": "{name} must not be negative",
        "less_than_equal": "{name} must be at most {le} seconds",
    }
)
FLAG = Says({"bool_type": "{name} must be true or false"})
TEXT = Says(
    {
        "string_type": "{name} must be a string",
        # NUL is refused on every database: PostgreSQL cannot store it, and SQLite would keep
        # what PostgreSQL refuses.
        "string_pattern_mismatch": "{name} must not contain NUL characters",
    }
)

NumberOnly = JsonNumber()
Whole = Annotated[int, WHOLE]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_INT32, allow_inf_nan=False), SECONDS]
Flag = Annotated[bool, Strict(), FLAG]
Text = Annotated[str, Strict(), Field(pattern="^[^\x00]*$"), TEXT]


JOB_ID_DIGITS = "^[0-9]{1,19}$"
JOB_ID_SCHEMA = {
    "oneOf": [
        {"type": "string", "pattern": JOB_ID_DIGITS},
        {"type": "integer", "minimum": 1, "maximum": MAX_ID},
    ],
    "description": "a job id: a string of digits or an integer",
}
JobId = Annotated[
    int,
    Field(ge=1, le=MAX_ID),
    # A string of digits as responses give it (JavaScript rounds integers past 2^53).
    JsonNumber(digits=JOB_ID_DIGITS),
    WithJsonSchema(JOB_ID_SCHEMA),
    Says(
        {
            **WHOLE.messages,
            "string_pattern_mismatch": "{name} must be a job id: a string of digits or an integer",
            "missing": "{name} must be an integer",
        }
    ),
]


class Body(BaseModel):
    """A JSON request body: fields it does not know are refused (`unknown` says how)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    unknown: ClassVar[str] = "unknown field {first!r}"

    @classmethod
    def refusal(cls, error: Mapping[str, Any], extra: list[str]) -> str:
        kind, loc = error["type"], error["loc"]
        if kind == "extra_forbidden":
            return cls.unknown.format(first=sorted(extra)[0], names=", ".join(sorted(extra)))
        if kind == "value_error":  # a rule tying fields together (a model validator)
            return str(error["ctx"]["error"])
        model: type[BaseModel] | None = cls
        says, bounds = None, {}
        for part in loc:
            if isinstance(part, int) or model is None:
                continue
            field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
            if field is None:
                break
            metadata = _metadata(field.metadata, field.annotation)
            # The outermost wins: it is the last, as Annotated flattens.
            says = next((m for m in reversed(metadata) if isinstance(m, Says)), None)
            bounds = _bounds(metadata)
            model = _model_in(field.annotation)
        name = next((str(p) for p in reversed(loc) if isinstance(p, str)), "the body")
        if says is None:
            return f"{name}: {error['msg']}"
        return says.reason(kind, name, error.get("input"), {**bounds, **error.get("ctx", {})})


def _metadata(metadata: list[Any], annotation: Any) -> list[Any]:
    """A field's annotations, with those of an optional field's type (`X | None`)."""
    found: list[Any] = []
    for candidate in get_args(annotation):
        if get_origin(candidate) is Annotated:
            found.extend(candidate.__metadata__)
    found.extend(metadata)
    for item in list(found):
        if isinstance(item, FieldInfo):
            found.extend(item.metadata)
    return found


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, Ge):
            bounds["ge"] = item.ge
        elif isinstance(item, Le):
            bounds["le"] = item.le
    return bounds


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself, or in a list)."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


B = TypeVar("B", bound=Body)
_EMPTY: dict[type[Body], Body] = {}


def parse(model: type[B], raw: bytes, *, empty_ok: bool = False) -> B:
    """The body, validated; an empty one is the model's defaults where `empty_ok`."""
    if not raw or raw.isspace():
        if not empty_ok:
            raise InvalidInput("the request body must be a JSON object")
        empty = _EMPTY.get(model)
        if empty is None:
            empty = _EMPTY[model] = model()
        assert isinstance(empty, model)
        return empty
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise InvalidInput(_reason(model, errors)) from None


def _reason(model: type[Body], errors: list[Any]) -> str:
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"malformed JSON: {first['ctx']['error']}"
    if first["type"] == "model_type" and not first["loc"]:
        return "the request body must be a JSON object"
    errors = _gated(errors)
    first = errors[0]
    extra = [str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden"]
    if extra:  # an unknown field is named before anything else
        first = next(e for e in errors if e["type"] == "extra_forbidden")
    return model.refusal(first, extra)


# ---------------------------------------------------------------------------------------------
# Answers

Time = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
MaybeTime = Annotated[
    str | None, WithJsonSchema({"type": ["string", "null"], "format": "date-time"})
]
# A datetime orjson writes (as isoformat() would): the hot pull answers skip the conversion.
MaybeMoment = Annotated[
    datetime | str | None, WithJsonSchema({"type": ["string", "null"], "format": "date-time"})
]


class Error(TypedDict):
    error: int
    detail: str


class Pages(TypedDict, total=False):
    next: str
    previous: str


class SelfLink(TypedDict):
    self: str


class Links(TypedDict):
    Result: list[str]
    Pages: Pages
    Links: SelfLink


class JobMessage(TypedDict):
    MessageID: str
    Payload: Annotated[str, Field(description="the body as text, or base64 (PayloadEncoding)")]
    PayloadEncoding: NotRequired[Literal["base64"]]
    ContentType: str
    Headers: dict[str, str]
