"""Tool declarations in each provider's shape, from one (name, description, schema) triple."""

from __future__ import annotations

import copy
from typing import Any, Literal

Format = Literal["openai", "openai-strict", "responses", "anthropic", "gemini"]
FORMATS: tuple[Format, ...] = ("openai", "openai-strict", "responses", "anthropic", "gemini")


def declare(name: str, description: str, schema: dict[str, Any], fmt: Format) -> dict[str, Any]:
    if fmt == "openai":
        return {"type": "function",
                "function": {"name": name, "description": description, "parameters": schema}}
    if fmt == "openai-strict":
        return {"type": "function",
                "function": {"name": name, "description": description, "strict": True,
                             "parameters": strict_schema(schema)}}
    if fmt == "responses":  # the Responses API's flat function tool
        return {"type": "function", "name": name, "description": description, "strict": True,
                "parameters": strict_schema(schema)}
    if fmt == "anthropic":
        return {"name": name, "description": description, "input_schema": schema}
    if fmt == "gemini":
        return {"name": name, "description": description, "parameters": _gemini_schema(schema)}
    raise ValueError(f"unknown declaration format {fmt!r}; choose one of {', '.join(FORMATS)}")


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAI strict mode: every object lists all its properties as required and allows no
    others; a property that was optional becomes nullable (``["integer", "null"]``), and the
    tools take ``null`` as "not given"."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        if node.get("type") == "object" or "properties" in node:
            properties: dict[str, Any] = node.setdefault("properties", {})
            required = set(node.get("required", []))
            for key, child in properties.items():
                walk(child)
                if key not in required:
                    kind = child.get("type")
                    if isinstance(kind, str):
                        child["type"] = [kind, "null"]
                    elif isinstance(kind, list) and "null" not in kind:
                        child["type"] = [*kind, "null"]
            node["required"] = list(properties)
            node["additionalProperties"] = False
        if isinstance(node.get("items"), dict):
            walk(node["items"])

    walk(out)
    return out


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
