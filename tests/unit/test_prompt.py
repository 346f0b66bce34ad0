"""The prompt builder: a realtime turn still being spoken renders as a prefix of the whole turn."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from omni.v1 import omni_pb2, stages_pb2

from services.common import tensors
from services.gateway.prompt import PromptBuilder
from services.models.profile import data_dir

_BUILDER: PromptBuilder | None = None


def builder() -> PromptBuilder:
    global _BUILDER
    if _BUILDER is None:
        _BUILDER = PromptBuilder(str(data_dir() / "models" / "tiny" / "thinker"))
    return _BUILDER


def _chunk(k: int) -> stages_pb2.EncodedItem:
    rows = np.full((3, 4), float(k), dtype=np.float32)
    return stages_pb2.EncodedItem(embeddings=tensors.describe(rows, content_hash=f"chunk{k}"))


def _conversation(chunks: int, kind: str = "audio") -> list[omni_pb2.Message]:
    media = [omni_pb2.ContentPart(audio=omni_pb2.AudioPart()) if kind == "audio"
             else omni_pb2.ContentPart(image=omni_pb2.ImagePart()) for _ in range(chunks)]  # fmt: skip
    return [
        omni_pb2.Message(role="system", content=[omni_pb2.ContentPart(text="be brief")]),
        omni_pb2.Message(role="user", content=media),
    ]


def _described(prompt: stages_pb2.Prompt) -> list:
    return [("emb", s.embeddings.content_hash) if s.HasField("embeddings") else ("ids", list(s.tokens.ids))
            for s in prompt.segments]  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(total=st.integers(1, 6), data=st.data())
def test_turn_so_far_is_a_prefix_of_the_whole_turn(total, data):
    spoken = data.draw(st.integers(1, total))
    whole = _described(builder().render(_conversation(total), [_chunk(k) for k in range(total)]))
    so_far = _described(builder().render(_conversation(spoken), [_chunk(k) for k in range(spoken)]))
    last = max(i for i, (kind, _) in enumerate(so_far) if kind == "emb")
    assert whole[: last + 1] == so_far[: last + 1]
    # Chunks of one audio stream are adjacent: no separator tokens between them.
    embs = [i for i, (kind, _) in enumerate(whole) if kind == "emb"]
    assert embs == list(range(embs[0], embs[0] + total))


def test_images_of_one_message_stay_separated():
    prompt = _described(builder().render(_conversation(2, "image"), [_chunk(0), _chunk(1)]))
    embs = [i for i, (kind, _) in enumerate(prompt) if kind == "emb"]
    assert embs[1] - embs[0] == 2 and prompt[embs[0] + 1][0] == "ids"
