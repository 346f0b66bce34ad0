"""Chat messages + encoder outputs -> the thinker's Prompt (token spans and embedding spans).

Works with any chat template: the conversation is rendered to text with a marker where each media
item goes; encoder text (cascade adapters) replaces its marker, encoder embeddings split the
prompt there. Markers use a control character that user text cannot carry.
"""

from __future__ import annotations

from omni.v1 import omni_pb2, stages_pb2
from transformers import AutoTokenizer

_MARK = "\x00"


def _marker(i: int) -> str:
    return f"{_MARK}{i}{_MARK}"


class PromptBuilder:
    def __init__(self, tokenizer_path: str):
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    def render(
        self, messages: list[omni_pb2.Message], encoded: list[stages_pb2.EncodedItem]
    ) -> stages_pb2.Prompt:
        """`encoded` holds one item per media part, in message order."""
        chat, n_media = [], 0
        for m in messages:
            content, previous = "", None
            for part in m.content:
                kind = part.WhichOneof("part")
                # Consecutive audio parts are one stream cut in chunks (realtime turns): nothing
                # between them, so a turn's first chunks render as a prefix of the whole turn.
                if previous is not None and not (kind == previous == "audio"):
                    content += "\n"
                if kind == "text":
                    content += part.text.replace(_MARK, "")
                else:
                    content += _marker(n_media)
                    n_media += 1
                previous = kind
            chat.append({"role": "system" if m.role == "developer" else m.role, "content": content})
        if n_media != len(encoded):
            raise ValueError(f"{n_media} media parts but {len(encoded)} encoder outputs")
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        for i, item in enumerate(encoded):
            if item.WhichOneof("output") == "text":
                text = text.replace(_marker(i), item.text)
        prompt = stages_pb2.Prompt()
        pieces = text.split(_MARK)  # text, index, text, index, ..., text
        for k, piece in enumerate(pieces):
            if k % 2:
                prompt.segments.add(embeddings=encoded[int(piece)].embeddings)
            elif piece:
                ids = self.tokenizer.encode(piece, add_special_tokens=False)
                prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=ids))
        return prompt

    def count_text_tokens(self, messages: list[omni_pb2.Message]) -> int:
        """Tokens of the text parts alone (what the quota debits before the prompt is built)."""
        texts = [part.text for m in messages for part in m.content if part.WhichOneof("part") == "text"]
        return (
            sum(len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"])
            if texts
            else 0
        )

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
