"""The prompt builder: a realtime turn still being spoken renders as a prefix of the whole turn; a
cascade's encoder text joins the text around it; the quota's token count is the layout's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from omni.v1 import stages_pb2

from services.common.paths import data_dir
from services.dataplane import tensors
from services.pipeline.prompt import PromptBuilder
from services.pipeline.turn import AudioClip, ImageInput, Message

_BUILDER: PromptBuilder | None = None


def builder() -> PromptBuilder:
    global _BUILDER
    if _BUILDER is None:
        _BUILDER = PromptBuilder(str(data_dir() / "models" / "tiny" / "thinker"))
    return _BUILDER


def _chunk(k: int) -> stages_pb2.EncodedItem:
    rows = np.full((3, 4), float(k), dtype=np.float32)
    return stages_pb2.EncodedItem(embeddings=tensors.describe(rows, content_hash=f"chunk{k}"))


def _media(kind: str):
    if kind == "audio":
        return AudioClip(rate=16000, frames=16000, samples=np.zeros(16000, np.float32))
    return ImageInput(width=8, height=8, detail="auto", content_hash="x", decode=None)


def _conversation(chunks: int, kind: str = "audio") -> list[Message]:
    return [Message("system", ("be brief",)), Message("user", tuple(_media(kind) for _ in range(chunks)))]


def render(messages, encoded) -> stages_pb2.Prompt:
    b = builder()
    return b.fill(b.layout(messages), encoded)


def _described(prompt: stages_pb2.Prompt) -> list:
    return [("emb", s.embeddings.content_hash) if s.HasField("embeddings") else ("ids", list(s.tokens.ids))
            for s in prompt.segments]  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(total=st.integers(1, 6), data=st.data())
def test_turn_so_far_is_a_prefix_of_the_whole_turn(total, data):
    spoken = data.draw(st.integers(1, total))
    whole = _described(render(_conversation(total), [_chunk(k) for k in range(total)]))
    so_far = _described(render(_conversation(spoken), [_chunk(k) for k in range(spoken)]))
    last = max(i for i, (kind, _) in enumerate(so_far) if kind == "emb")
    assert whole[: last + 1] == so_far[: last + 1]
    # Chunks of one audio stream are adjacent: no separator tokens between them.
    embs = [i for i, (kind, _) in enumerate(whole) if kind == "emb"]
    assert embs == list(range(embs[0], embs[0] + total))


def test_images_of_one_message_stay_separated():
    prompt = _described(render(_conversation(2, "image"), [_chunk(0), _chunk(1)]))
    embs = [i for i, (kind, _) in enumerate(prompt) if kind == "emb"]
    assert embs[1] - embs[0] == 2 and prompt[embs[0] + 1][0] == "ids"


def test_encoder_text_joins_the_text_around_it():
    """A cascade's ASR text replaces its slot: one token span, as if the user had typed it."""
    messages = [Message("user", ("hello", _media("audio"), "world"))]
    prompt = render(messages, [stages_pb2.EncodedItem(text="there")])
    typed = render([Message("user", ("hello\nthere\nworld",))], [])
    assert _described(prompt) == _described(typed)


def test_layout_counts_the_tokens_of_its_text():
    b = builder()
    layout = b.layout(_conversation(2))
    assert layout.text_tokens == sum(
        len(b.tokenizer.encode(p, add_special_tokens=False)) for p in layout.pieces if p
    )


def test_placed_media_keep_their_placement_and_count_their_wrapping_tokens():
    """Embeddings the thinker model places itself (Qwen3-Omni) carry their placement into the
    prompt, and the prompt's token count includes the tokens around them (the context check and
    the quota count what the engine runs)."""
    from services.pipeline.prompt import prompt_tokens

    item = _chunk(0)
    item.placement.CopyFrom(
        stages_pb2.MediaPlacement(
            modality="audio", placeholder_id=7, prefix_ids=[5], suffix_ids=[6], feature_frames=20
        )
    )
    plain = render(_conversation(1), [_chunk(0)])
    placed = render(_conversation(1), [item])
    (seg,) = [s for s in placed.segments if s.HasField("embeddings")]
    assert seg.placement.feature_frames == 20 and seg.placement.placeholder_id == 7
    assert prompt_tokens(placed) == prompt_tokens(plain) + 2
