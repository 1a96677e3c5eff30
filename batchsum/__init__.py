"""batchsum: summarize text in bulk through a rate-limited summarization API.

``Client`` / ``AsyncClient`` for one summary per call; ``summarize_texts`` and the pandas accessor
``df.batchsum.summarize(...)`` for many; ``batchsum`` on the command line for Parquet files.
"""

from __future__ import annotations

from .client import AsyncClient, Client
from .contract import Mode, SummaryType
from .errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BatchsumError,
    ConfigurationError,
    InputError,
    InvalidParameterError,
    InvalidTextError,
    NotPremiumError,
    RateLimitError,
    ServerError,
    TextTooLongError,
    TextTooShortError,
    UnprocessableEntityError,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "Mode",
    "SummaryType",
    "BatchsumError",
    "ConfigurationError",
    "InputError",
    "InvalidParameterError",
    "InvalidTextError",
    "APIError",
    "APIConnectionError",
    "APITimeoutError",
    "APIResponseValidationError",
    "APIStatusError",
    "AuthenticationError",
    "NotPremiumError",
    "UnprocessableEntityError",
    "TextTooShortError",
    "TextTooLongError",
    "RateLimitError",
    "ServerError",
]
