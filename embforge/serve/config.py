"""Server settings as one dataclass (the CLI fills it; :func:`embforge.serve.app.create_app` takes it)."""

from __future__ import annotations

from dataclasses import dataclass

from embforge.ranges import NON_NEGATIVE, POSITIVE_INT, SECONDS, Range, check

# the numeric fields' ranges: the CLI's flags' (embforge.cli.serve)
_RANGES: dict[str, Range] = {
    "max_batch_size": POSITIVE_INT,
    "max_batch_tokens": POSITIVE_INT,
    "max_queue": POSITIVE_INT,
    "max_wait_ms": NON_NEGATIVE,
    "max_inputs": POSITIVE_INT,
    "max_chars": POSITIVE_INT,
    "max_body_bytes": POSITIVE_INT,
    "request_timeout_s": SECONDS,
    "default_top_k": POSITIVE_INT,
    "header_timeout_s": SECONDS,
    "body_timeout_s": SECONDS,
    "keep_alive_s": SECONDS,
    "max_connections": POSITIVE_INT,
}


@dataclass
class ServeConfig:
    """Limits, batching and security settings of the server.

    Attributes:
        model_name: Name reported in responses (``model`` field) and accepted in requests.
        max_batch_size: Most texts (or pairs) merged into one model call.
        max_batch_tokens: Most padded tokens in one model call (longest text's tokens times the texts; TEI's
            ``--max-batch-tokens``); the queue is sorted by length, so short texts batch apart from long ones.
        max_queue: Most texts (or pairs) waiting per model; a request beyond gets 429 (other models unaffected).
        max_wait_ms: How long the first queued request waits for others to join its batch.
        max_inputs: Most texts (documents, pairs) in one request; more gets 413.
        max_chars: Most characters in one text; longer gets 413 unless ``truncate`` is set.
        truncate: Cut texts longer than ``max_chars`` instead of rejecting them.
        max_body_bytes: Largest request body; larger gets 413 before it is parsed.
        api_key: When set, every endpoint but ``/health`` needs ``Authorization: Bearer <api_key>``; an empty key
            is an error (it would switch auth off).
        request_timeout_s: A request waiting longer than this for the model gets 503.
        default_top_k: ``top_k`` of ``/search`` when the request does not say.
        reranker_name: Name reported by ``/rerank`` (the CLI uses ``--reranker``).
        header_timeout_s: A connection must send a request's whole head within this many seconds of connecting
            (or of its first byte, on a kept-alive connection); else 408 and closed (slow-header clients).
        body_timeout_s: ... and its whole body within this many seconds after the head; else closed.
        keep_alive_s: An idle kept-alive connection is closed after this many seconds.
        max_connections: Most open connections; one more is answered 503 and closed at once.
    """

    model_name: str = "embforge"
    max_batch_size: int = 64
    max_batch_tokens: int = 16384
    max_queue: int = 4096
    max_wait_ms: float = 5.0
    max_inputs: int = 256
    max_chars: int = 8192
    truncate: bool = False
    max_body_bytes: int = 2 * 1024 * 1024
    api_key: str | None = None
    request_timeout_s: float = 30.0
    default_top_k: int = 10
    reranker_name: str | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 1024

    def __post_init__(self) -> None:
        for name, allowed in _RANGES.items():
            check(f"ServeConfig.{name}", getattr(self, name), allowed)
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError(
                "the API key (--api-key) is empty or only whitespace: give a key, or leave --api-key out to "
                "serve without auth"
            )
