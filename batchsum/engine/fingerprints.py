"""A request's identity: the fingerprint identical requests share one answer by (in the store, in a run,
across runs), made once per text without a JSON encoder per request (``text_fingerprint``)."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable

from ..service import contract
from ..service.client import PreparedRequest

__all__ = ["fingerprint", "text_fingerprint"]


def fingerprint(request: PreparedRequest) -> str:
    """The request's identity: text, mode, percentage and type. Identical requests share one answer."""
    payload = json.dumps(request.fields(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=64)
def text_fingerprint(params: contract.Params) -> Callable[[str], str]:
    """``fingerprint`` of a text with ``params``, the same value, made without a dict and a JSON
    encoder per text: the request's JSON is the parameters' (encoded once) around the text's."""
    marker = "\ue000batchsum\ue001"
    head, tail = json.dumps(PreparedRequest(marker, params).fields(), sort_keys=True, ensure_ascii=False).split(
        json.dumps(marker, ensure_ascii=False)
    )
    encode, sha256 = json.encoder.encode_basestring, hashlib.sha256

    def key(text: str) -> str:
        return sha256((head + encode(text) + tail).encode("utf-8")).hexdigest()

    return key
