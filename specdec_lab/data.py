"""Prompt sets and chat templating."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    id: str  # unique within a prompt set, stable across runs (the benchmark resumes by it)
    category: str  # e.g. "code", "writing", "sql": metrics are reported per category
    text: str


def encode(tokenizer, prompt: Prompt, chat: bool = True) -> list[int]:
    """Token ids for a prompt, through the model's chat template when it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    ids = tokenizer(prompt.text)["input_ids"]
    if not ids and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id]
    return list(ids)
