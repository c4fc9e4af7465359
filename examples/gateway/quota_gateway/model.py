"""A fake chat model: a rough tokenizer and a token stream with realistic delays.

The completion's length is a deterministic function of the prompt (between a quarter of
``max_tokens`` and ``max_tokens``), so a run can be replayed; a prompt containing
``[[tokens=N]]`` asks for exactly ``min(N, max_tokens)`` tokens (tests use it).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

_TEXT = (
    "the quota store admits each request against every limit at once and settles what the model "
    "really produced so budgets stay exact while tokens stream to the client"
)
_WORDS = _TEXT.split()

_ASK = re.compile(r"\[\[tokens=(\d+)\]\]")


def prompt_text(messages: Sequence[Any]) -> str:
    """The text of an OpenAI ``messages`` list (string contents and text parts)."""
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object")
        content = m.get("content", "")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        else:
            raise ValueError("message content must be a string or a list of parts")
    return "\n".join(parts)


def count_tokens(text: str, messages: int = 1) -> int:
    """About 4 characters per token, plus 4 tokens of framing per message (as chat APIs add)."""
    return math.ceil(len(text) / 4) + 4 * messages


def completion_length(prompt: str, max_tokens: int) -> int:
    """How many tokens the fake model answers ``prompt`` with (at least 1)."""
    asked = _ASK.search(prompt)
    if asked:
        return max(1, min(int(asked.group(1)), max_tokens))
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    low = max(1, max_tokens // 4)
    return low + h % (max_tokens - low + 1)


async def generate(
    prompt: str, max_tokens: int, first_token_ms: int, token_ms: int
) -> AsyncIterator[str]:
    """Yields the completion one token (a word and a space) at a time: the first after
    ``first_token_ms``, then one every ``token_ms``."""
    n = completion_length(prompt, max_tokens)
    await asyncio.sleep(first_token_ms / 1000)
    for i in range(n):
        if i:
            await asyncio.sleep(token_ms / 1000)
        yield _WORDS[i % len(_WORDS)] + " "
