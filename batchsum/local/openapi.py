"""The interface as an OpenAPI 3.1 document, served by the local service at ``/openapi.json``.

Written by hand from ``contract`` (the service is plain Starlette): one operation, its three body
encodings, its answers and their two body shapes, FastAPI's 422 "Validation Error" body, and the
limits. ``docs/interface.md`` says the same in words, with what batchsum assumes where the public
documentation is silent. The test controls (``/_local/*``) are not part of the interface.
"""

from __future__ import annotations

from typing import Any

from ..service import contract
from ..service.contract import Messages

__all__ = ["openapi_document"]


def _error(description: str, *shapes: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = (
        {"$ref": f"#/components/schemas/{shapes[0]}"}
        if len(shapes) == 1
        else {"anyOf": [{"$ref": f"#/components/schemas/{shape}"} for shape in shapes]}
    )
    answer: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        answer["headers"] = headers
    return answer


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the summarization interface."""
    types = [t.value for t in contract.SummaryType]
    request: dict[str, Any] = {
        "type": "object",
        "required": [contract.FIELD_TEXT, contract.FIELD_MODE],
        "properties": {
            contract.FIELD_TEXT: {
                "type": "string",
                # At least MIN_WORDS words (an unanchored pattern: found anywhere in the text); the
                # upper limit is in words too, which JSON Schema cannot state: see the description.
                "pattern": rf"\S+(\s+\S+){{{contract.MIN_WORDS - 1}}}",
                "description": f"The content to summarize: {contract.MIN_WORDS} to {contract.MAX_WORDS} words "
                "(words are runs of characters between white space).",
            },
            contract.FIELD_MODE: {
                "type": "integer",
                "enum": [1, 2],
                "description": "1 = standard (smaller model), 2 = advanced (full model).",
            },
            contract.FIELD_PERCENTAGE: {
                "type": "integer",
                "minimum": contract.PERCENTAGE_MIN,
                "maximum": contract.PERCENTAGE_MAX,
                "default": contract.PERCENTAGE_DEFAULT,
                "description": "Summary length, 1 (shortest) to 6 (longest).",
            },
            contract.FIELD_TYPE: {
                "type": "string",
                "enum": types,
                "description": "Output format; left out for a plain summary.",
            },
        },
    }
    # Over form fields every value is text ("2", not 2).
    form = {
        "type": "object",
        "required": request["required"],
        "properties": {
            contract.FIELD_TEXT: request["properties"][contract.FIELD_TEXT],
            contract.FIELD_MODE: {"type": "string", "enum": ["1", "2"]},
            contract.FIELD_PERCENTAGE: {"type": "string", "enum": [str(p) for p in range(1, 7)]},
            contract.FIELD_TYPE: {"type": "string", "enum": types},
        },
    }
    retry_after = {
        "Retry-After": {
            "description": "Seconds until a request would be admitted.",
            "schema": {"type": "integer", "minimum": 1},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Text summarization service (batchsum's local reference implementation)",
            "version": "1",
            "description": "One operation that turns a text into a summary. See docs/interface.md.",
        },
        "paths": {
            contract.SUMMARIZE_PATH: {
                "post": {
                    "operationId": "summarize",
                    "summary": "Summarize a text",
                    "security": [{"bearer": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": request},
                            "multipart/form-data": {"schema": form},
                            "application/x-www-form-urlencoded": {"schema": form},
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "The summary.",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Result"}}},
                        },
                        "401": _error(f'"{Messages.INVALID_KEY}" or "{Messages.NOT_PREMIUM}" (shape B).', "ShapeB"),
                        "413": _error("The body is over 1 MiB (the local service's guard).", "ShapeA"),
                        "422": _error(
                            "Invalid parameters: FastAPI's validation body for missing or mistyped fields; "
                            f'"{Messages.TOO_SHORT}" (shape B) or "{Messages.TOO_LONG}" (shape A) for the word limits.',
                            "HTTPValidationError",
                            "ShapeA",
                            "ShapeB",
                        ),
                        "429": _error(
                            f'"{Messages.RATE_LIMITED}": over the per-minute limit of the key\'s plan.',
                            "ShapeA",
                            headers=retry_after,
                        ),
                        "500": _error(f'"{Messages.SERVER}".', "ShapeA"),
                    },
                }
            },
            "/": {
                "get": {
                    "operationId": "index",
                    "summary": "What this service is",
                    "responses": {
                        "200": {
                            "description": "A short description.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <API_KEY>"}
            },
            "schemas": {
                "Result": {
                    "type": "object",
                    "required": [contract.FIELD_RESULT],
                    "properties": {contract.FIELD_RESULT: {"type": "string"}},
                },
                "ShapeA": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "ShapeB": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                },
                "HTTPValidationError": {
                    "title": "Validation Error",
                    "type": "object",
                    "required": ["detail"],
                    "properties": {
                        "detail": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["loc", "msg", "type"],
                                "properties": {
                                    "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                                    "msg": {"type": "string"},
                                    "type": {"type": "string"},
                                },
                            },
                        }
                    },
                },
            },
        },
    }
