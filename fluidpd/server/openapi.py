"""The app's OpenAPI schema: FastAPI's, plus what FastAPI cannot see: the JSON bodies json_body
parses, and the OpenAI error body of every failure (never FastAPI's 422: a bad request is a 400)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from fluidpd.server.protocol import ErrorResponse


def add_openapi(app: FastAPI, routes: list) -> None:
    """Make app.openapi() (and so /openapi.json) document what `routes` (the app's) take and answer."""
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            _document(base(), routes)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(schema: dict, routes: list) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)

    def ref(model) -> dict:
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}), **{model.__name__: body})
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    error = {
        "description": "An error, in OpenAI's error body",
        "content": {"application/json": {"schema": ref(ErrorResponse)}},
    }
    for route in routes:
        if not isinstance(route, APIRoute):
            continue
        model = next((d.call.body_model for d in route.dependant.dependencies if hasattr(d.call, "body_model")), None)
        for method in route.methods:
            op = schema["paths"][route.path_format][method.lower()]
            op["responses"].pop("422", None)
            op["responses"]["default"] = error
            if model is not None:
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(model)}}}
