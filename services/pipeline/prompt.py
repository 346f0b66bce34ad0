"""A conversation + encoder outputs -> the thinker's Prompt (token spans and embedding spans).

Works with any chat template. `layout` renders the conversation with a marker where each media item
goes and tokenizes the text between markers (before admission: the quota counts these tokens);
`fill` puts each encoder output in its place — embeddings become their own span, encoder text
(cascade adapters) joins the text around it. Markers use a control character that user text cannot
carry. Text pieces recur across the requests of a conversation (its earlier turns, the template's
role tags): their token ids are cached, so a turn tokenizes only what is new.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from omni.v1 import stages_pb2
from transformers import AutoTokenizer

from services.pipeline.tools import Tool, arguments_value, calls_text, described
from services.pipeline.turn import AudioClip, DocumentInput, Message, media_of

_MARK = "\x00"
CACHED_PIECES = 4096


def _marker(i: int) -> str:
    return f"{_MARK}{i}{_MARK}"


@dataclass(frozen=True)
class Layout:
    pieces: tuple[str, ...]  # the rendered text around the media slots: len = media items + 1
    text_tokens: int  # tokens of the pieces


class PromptBuilder:
    def __init__(self, tokenizer_path: str):
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # The template renders tools and tool calls itself (Qwen3-Omni's does; tiny's and SmolLM2's
        # do not).
        template = self.tokenizer.chat_template or ""
        self.native_tools = "tools" in template and "tool_calls" in template
        # The most characters one token can stand for: a vocabulary entry's length (byte-level BPE
        # spells each byte as one character, and a character is at least one byte). Text of n
        # characters is at least n / max_token_chars tokens, so text that cannot fit the context
        # is refused before it is tokenized (a 40 MB body takes seconds to tokenize).
        self.max_token_chars = max(map(len, self.tokenizer.get_vocab()))

    def _encode(self, text: str) -> tuple[int, ...]:
        ids = self._ids.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            self._ids[text] = ids
            if len(self._ids) > CACHED_PIECES:
                self._ids.popitem(last=False)
        else:
            self._ids.move_to_end(text)
        return ids

    def layout(
        self,
        messages: tuple[Message, ...] | list[Message],
        tools: tuple[Tool, ...] = (),
        content_or_calls: bool = False,
    ) -> Layout:
        """With `tools`, the template gets them (and each message's calls and results) where it has
        a place for them; otherwise they are written as text: the tools in a system message, calls
        as JSON in the assistant's content, and with `content_or_calls` the shape of an answer
        ("auto" generated as structured output: tools.py)."""
        chat, n_media = [], 0
        native = self.native_tools
        if tools and not native:
            chat.append({"role": "system", "content": described(tools, content_or_calls)})
        for m in messages:
            content, previous = "", None
            for part in m.parts:
                kind = (
                    "text" if isinstance(part, str) else ("audio" if isinstance(part, AudioClip) else "media")
                )
                # Consecutive audio parts are one stream cut in chunks (realtime turns): nothing
                # between them, so a turn's first chunks render as a prefix of the whole turn.
                if previous is not None and not (kind == previous == "audio"):
                    content += "\n"
                if kind == "text":
                    content += part.replace(_MARK, "")
                else:
                    slots = []
                    for _ in media_of(part):
                        slots.append(_marker(n_media))
                        n_media += 1
                    if isinstance(part, DocumentInput):  # a document's pages, numbered
                        slots = [f"Page {k}:\n{slot}" for k, slot in enumerate(slots, 1)]
                    content += "\n".join(slots)  # a clip, then its audio track
                previous = kind
            message = {"role": m.role, "content": content}
            if m.tool_calls and native:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments_value(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            elif m.tool_calls:
                message["content"] = (content + "\n" if content else "") + calls_text(m.tool_calls)
            if m.tool_call_id:
                message["tool_call_id"] = m.tool_call_id
            chat.append(message)
        extra = {"tools": [t.openai() for t in tools]} if tools and native else {}
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **extra)
        pieces = tuple(text.split(_MARK)[::2])  # text, index, text, index, ..., text
        return Layout(pieces, sum(len(self._encode(p)) for p in pieces if p))

    def fill(self, layout: Layout, encoded: list[stages_pb2.EncodedItem]) -> stages_pb2.Prompt:
        """`encoded` holds one output per media slot, in order."""
        if len(layout.pieces) != len(encoded) + 1:
            raise ValueError(f"{len(layout.pieces) - 1} media slots but {len(encoded)} encoder outputs")
        prompt = stages_pb2.Prompt()
        text = layout.pieces[0]
        for item, piece in zip(encoded, layout.pieces[1:], strict=True):
            if item.WhichOneof("output") == "text":
                text += item.text + piece
                continue
            if text:
                prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=self._encode(text)))
            segment = prompt.segments.add(embeddings=item.embeddings)
            if item.HasField("placement"):
                segment.placement.CopyFrom(item.placement)
            text = piece
        if text:
            prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=self._encode(text)))
        return prompt

    def item_tokens(self, item: stages_pb2.EncodedItem) -> int:
        """Prompt tokens one encoder output takes: its rows (and placement tokens), or its text's."""
        if item.WhichOneof("output") == "text":
            return len(self._encode(item.text))
        placed = item.placement
        return item.embeddings.shape[0] + len(placed.prefix_ids) + len(placed.suffix_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def segment_tokens(segment: stages_pb2.PromptSegment) -> int:
    if segment.HasField("tokens"):
        return len(segment.tokens.ids)
    placed = segment.placement
    return segment.embeddings.shape[0] + len(placed.prefix_ids) + len(placed.suffix_ids)


def prompt_tokens(prompt: stages_pb2.Prompt) -> int:
    return sum(segment_tokens(s) for s in prompt.segments)


def expanded_ids(prompt: stages_pb2.Prompt) -> tuple[list[int], list[stages_pb2.MediaPlacement]]:
    """The prompt's token ids as the thinker runs them, each placed media item's placeholder
    repeated once per row, and the items' placements in order (what a token talker reads). Plain
    prompt embeddings have no token ids: a ValueError."""
    ids: list[int] = []
    placements: list[stages_pb2.MediaPlacement] = []
    for seg in prompt.segments:
        if seg.HasField("tokens"):
            ids.extend(seg.tokens.ids)
        elif seg.HasField("placement"):
            pl = seg.placement
            ids.extend([*pl.prefix_ids, *[pl.placeholder_id] * seg.embeddings.shape[0], *pl.suffix_ids])
            placements.append(pl)
        else:
            raise ValueError("prompt embeddings have no token ids")
    return ids, placements
