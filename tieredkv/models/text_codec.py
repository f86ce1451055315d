"""Text <-> token ids. HF tokenizers for real models, a byte tokenizer for the tiny test models."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class TextCodec(Protocol):
    """What tieredkv needs of a tokenizer."""

    identity: str  # stable text that goes into the model fingerprint
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def chat_prompt(self, user: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, BOS 256, EOS 257. Offline, exact, and tiny."""

    identity = "tieredkv-bytes-v1"
    bos_token_id, eos_token_id, vocab_size = 256, 257, 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def chat_prompt(self, user: str) -> list[int]:
        return self.encode(f"Q: {user}\nA:")


@dataclass
class HFCodec:
    """Adapter over a transformers tokenizer."""

    tokenizer: Any
    identity: str

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_prompt(self, user: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            out = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(out, dict) or hasattr(out, "keys"):
                out = out["input_ids"]
            return list(out)
        return self.encode(user)


def chat_frame(codec) -> tuple[str, str]:
    """The text before and after a single user message in the codec's chat template
    (("", "\\n") without one), so long content can be tokenized apart from the question."""
    tok = getattr(codec, "tokenizer", None)
    if tok is None or not getattr(tok, "chat_template", None):
        return "", "\n"
    marker = "\u2063MSG\u2063"
    full = tok.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True, tokenize=False)
    pre, post = full.split(marker)
    return pre, post
