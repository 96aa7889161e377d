"""The OpenAPI document tells the truth: every request body, generated from its pydantic model
(JSON, and multipart/form-data where the route table accepts it), and the limits of the
running settings and the error codes of this server (each route's error codes come from
``app.api.route_errors``).

Schemas are declared once with the fixed bounds (2..MAX_N images, ...); `install_openapi`
patches in the instance's own limits (LAD_MAX_IMAGES, LAD_MAX_RERANK_CANDIDATES,
LAD_MAX_QUERY_CHARS, LAD_MAX_LABEL_CHARS), so what the document accepts is what the service accepts.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from app.errors import ERRORS
from app.settings import Settings
from lad_client.routes import FORM


def form_schema(model: type[BaseModel], files_field: str) -> dict[str, Any]:
    """The multipart/form-data schema of a JSON request model: ``files_field`` becomes image
    files, each other field one text part: ``null`` is sent by leaving the field out, and a
    list (``labels``) as one text, a JSON list or a comma list (what the form reader parses)."""
    schema = copy.deepcopy(model.model_json_schema())
    schema.pop("examples", None)
    schema["additionalProperties"] = False  # the form reader refuses unknown fields (422)
    properties = schema["properties"]
    for name, prop in properties.items():
        if name == files_field:  # the bounds of its list (its array alternative, if any)
            listed = next((a for a in prop.get("anyOf", []) if a.get("type") == "array"), prop)
            kept = {k: listed[k] for k in ("minItems", "maxItems") if k in listed}
            kept.update({"description": prop["description"]} if "description" in prop else {})
            properties[name] = {
                "type": "array",
                "items": {"type": "string", "format": "binary"},
                **kept,
            }
        elif "anyOf" in prop:
            properties[name] = _form_field(prop)
    return schema


def _form_field(prop: dict[str, Any]) -> dict[str, Any]:
    """One text part for a field with alternatives (see ``form_schema``)."""
    alternatives = [alt for alt in prop["anyOf"] if alt.get("type") != "null"]
    rest = {k: v for k, v in prop.items() if k != "anyOf" and not (k == "default" and v is None)}
    if len(alternatives) == 1:
        return {**alternatives[0], **rest}
    texts = [alt for alt in alternatives if alt.get("type") == "string"]
    patterns = [
        "^(" + "|".join(re.escape(v) for v in alt["enum"]) + ")$"
        if "enum" in alt
        else alt.get("pattern", "^.*$")
        for alt in texts
    ]
    if any(alt.get("type") == "array" for alt in alternatives):
        patterns += [r"^\[.*\]$", r"^[^,]+(,[^,]+)+$"]  # a JSON list, a comma list
    return {"type": "string", "pattern": "|".join(patterns), **rest}


def request_body(
    model: type[BaseModel],
    content_types: Sequence[str],
    files_field: str | None,
    examples: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads its body by hand: per accepted content
    type, the schema generated from ``model``; JSON with the model's working example (or the
    named ``examples``)."""
    content: dict[str, Any] = {}
    for media_type in content_types:
        if media_type == FORM:
            if files_field is None:
                raise ValueError(f"{model.__name__}: a form body needs its files field")
            content[media_type] = {"schema": form_schema(model, files_field)}
            continue
        media: dict[str, Any] = {"schema": model.model_json_schema()}
        model_examples = media["schema"].get("examples")
        if examples is not None:
            media["examples"] = examples
        elif model_examples:
            media["example"] = model_examples[0]
        content[media_type] = media
    return {"requestBody": {"required": True, "content": content}}


def _patch_limits(node: Any, settings: Settings) -> None:
    """Set the instance's limits on every object schema with these property names."""
    if isinstance(node, list):
        for item in node:
            _patch_limits(item, settings)
        return
    if not isinstance(node, dict):
        return
    props = node.get("properties")
    if isinstance(props, dict):
        if isinstance(props.get("images"), dict):
            props["images"]["maxItems"] = settings.max_images
        if isinstance(props.get("documents"), dict):  # (maxItems bounds arrays only)
            documents = props["documents"]
            for alt in [documents, *documents.get("anyOf", [])]:
                if alt is documents or alt.get("type") == "array":
                    alt["maxItems"] = settings.max_rerank_candidates
        if isinstance(props.get("query"), dict) and props["query"].get("type") == "string":
            props["query"]["maxLength"] = settings.max_query_chars
        if isinstance(props.get("answer"), dict):
            props["answer"].pop("exclusiveMaximum", None)
            props["answer"]["maximum"] = settings.max_images - 1
        for alt in (props.get("labels") or {}).get("anyOf", []):
            if alt.get("type") == "array":
                alt["maxItems"] = settings.max_images
                alt["items"]["maxLength"] = settings.max_label_chars
    for value in node.values():
        _patch_limits(value, settings)


def _hoist_defs(document: dict[str, Any]) -> None:
    """Move the ``$defs`` of hand-written request bodies into ``components/schemas`` (where
    OpenAPI tools resolve references) and point their ``$ref`` there."""
    components = document.setdefault("components", {}).setdefault("schemas", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node["$ref"] = "#/components/schemas/" + ref.removeprefix("#/$defs/")
            for value in node.values():
                rewrite(value)
        elif isinstance(node, list):
            for item in node:
                rewrite(item)
        return node

    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for media in operation.get("requestBody", {}).get("content", {}).values():
                schema = media.get("schema", {})
                for name, definition in schema.pop("$defs", {}).items():
                    components.setdefault(name, definition)
                rewrite(schema)
    rewrite(components)


def _enumerate_error_codes(document: dict[str, Any]) -> None:
    """List this server's error codes (``app.errors.ERRORS``) as the enum of
    ``ErrorDetail.code``: the wire type keeps a plain string so that a client accepts the
    codes a newer server adds, the document says which ones this server answers."""
    detail = document.get("components", {}).get("schemas", {}).get("ErrorDetail")
    if detail is not None:
        detail["properties"]["code"]["enum"] = [cls.code for cls in ERRORS]


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Generate the document once, with the running settings' limits."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            _hoist_defs(document)
            _enumerate_error_codes(document)
            _patch_limits(document, settings)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
