"""What the typed parts of the config share (planning/model_config.py, stack_config.py,
workload_config.py): a base that refuses unknown keys, numbers kept as YAML gives them, keys
absent unless given, and a model's JSON Schema as the config schema holds it (plain: what
jsonschema reads and what its messages name well). planning/experiment.py's root holds them
all, and its schema is the config's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def _no_default(schema: dict) -> None:
    """A key that is absent unless given: no default for the schema to fill, and no null."""
    schema.pop("default", None)
    alternatives = [a for a in schema.pop("anyOf", []) if a != {"type": "null"}]
    if len(alternatives) == 1:
        schema.update(alternatives[0])
    elif alternatives:
        schema["anyOf"] = alternatives


def absent(description: str, **bounds) -> Any:
    """A key absent unless given (None here), with its bounds where given (ge=1, ...)."""
    return Field(None, description=description, json_schema_extra=_no_default, **bounds)


def _empty_default(schema: dict) -> None:
    schema["default"] = {}


def nested(model: type[BaseModel], description: str) -> Any:
    """An object inside a section, its own defaults filled where it is absent (the schema's
    default {}, as a hand-written one says it)."""
    return Field(default_factory=model, description=description, json_schema_extra=_empty_default)


class Entry(BaseModel):
    """A config entry: an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")


def _plain(node, defs: dict):
    """The schema without titles, its $refs inlined and each 'one of these types or null' as
    one type list (as a hand-written schema says it, and as jsonschema's messages read best)."""
    if isinstance(node, list):
        return [_plain(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    out = {k: _plain(v, defs) for k, v in node.items() if k not in ("title", "$defs")}
    if isinstance(out.get("description"), str):  # a docstring's lines, as one line
        out["description"] = " ".join(out["description"].split())
    alternatives = out.get("anyOf")
    if alternatives and all(isinstance(a.get("type"), str) for a in alternatives):
        bounds = [{k: v for k, v in a.items() if k != "type"} for a in alternatives]
        given = [b for b in bounds if b]
        if all(b == given[0] for b in given) and not any(a["type"] in ("array", "object") for a in alternatives):
            del out["anyOf"]
            # an int or a float is a JSON Schema number (kept apart only so that 24 stays 24)
            types = [a["type"] for a in alternatives]
            types = [t for t in types if t != "integer" or "number" not in types]
            out = {"type": types if len(types) > 1 else types[0], **(given[0] if given else {}), **out}
    return out


def plain_schema(model: type[BaseModel]) -> dict:
    """A model's JSON Schema as the config schema holds it."""
    schema = model.model_json_schema()
    return _plain(schema, schema.get("$defs", {}))
