"""Tool declarations in each provider's shape, from one (name, description, schema) triple."""

from __future__ import annotations

import copy
from typing import Any, Literal

Format = Literal["openai", "anthropic", "gemini"]
FORMATS: tuple[Format, ...] = ("openai", "anthropic", "gemini")


def declare(name: str, description: str, schema: dict[str, Any], fmt: Format) -> dict[str, Any]:
    if fmt == "openai":
        return {"type": "function",
                "function": {"name": name, "description": description, "parameters": schema}}
    if fmt == "anthropic":
        return {"name": name, "description": description, "input_schema": schema}
    if fmt == "gemini":
        return {"name": name, "description": description, "parameters": _gemini_schema(schema)}
    raise ValueError(f"unknown declaration format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _gemini_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Gemini takes an OpenAPI subset: upper-case types, no additionalProperties."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        node.pop("additionalProperties", None)
        if isinstance(node.get("type"), str):
            node["type"] = node["type"].upper()
        for child in node.get("properties", {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])

    walk(out)
    return out
