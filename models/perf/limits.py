"""Engine limits the perf model needs to turn forward-pass times into latencies.

They come from the engine's model card (vLLM's ``max_num_batched_tokens``,
``max_num_seqs``, the KV-cache size) and bound every capacity search: a
forward pass never computes more than ``max_num_batched_tokens`` prefill
tokens, never runs more than ``max_num_seqs`` sequences, and the decode batch
must fit in ``max_kv_tokens``. Defaults are Dynamo's fallbacks when the card
lacks a value (8192 batched tokens, 256 sequences).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EngineLimits:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_kv_tokens: int | None = None
    max_context_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            _check_positive(name, getattr(self, name))
        for name in ("max_kv_tokens", "max_context_length"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(name, value)

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EngineLimits:
        return cls(**state)


def _check_positive(name: str, value: object) -> None:
    # bool is an int subclass; a True here is a config mistake, not a limit of 1.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
