"""gRPC `omni.v1.Omni` through Serve's gRPC proxy, with stubs generated from protos/."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from tests.conftest import grpc_channel, png_bytes, wav_bytes


@pytest.fixture(scope="module")
def stub(omniray):
    channel = grpc_channel(omniray.grpc_target)
    yield omni_pb2_grpc.OmniStub(channel)
    channel.close()


def _request(model_name, *parts, modalities=("text",), max_tokens=16):
    msg = omni_pb2.Message(role="user", content=list(parts))
    return omni_pb2.ChatRequest(
        model=model_name,
        messages=[msg],
        modalities=list(modalities),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0),
    )


def test_chat_text_stream(stub, model_name):
    chunks = list(stub.Chat(_request(model_name, omni_pb2.ContentPart(text="Hello")), timeout=60))
    text = "".join(c.text for c in chunks if c.WhichOneof("delta") == "text")
    assert text
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 16


def test_chat_audio_out_with_image_and_speech_in(stub, model_name):
    req = _request(
        model_name,
        omni_pb2.ContentPart(text="Describe"),
        omni_pb2.ContentPart(image=omni_pb2.ImagePart(data=png_bytes())),
        omni_pb2.ContentPart(audio=omni_pb2.AudioPart(data=wav_bytes(), format="wav")),
        modalities=("text", "audio"),
    )
    chunks = list(stub.Chat(req, timeout=60))
    audio = [c.audio for c in chunks if c.WhichOneof("delta") == "audio"]
    text = "".join(c.text for c in chunks if c.WhichOneof("delta") == "text")
    assert audio and all(a.sample_rate == 24000 for a in audio)
    pcm = np.frombuffer(b"".join(a.pcm16 for a in audio), dtype="<i2")
    assert len(pcm) == len(text.encode()) * 2 * 480
    # Each spoken piece names its words; together they are the answer.
    assert "".join(a.transcript for a in audio) == text


def test_list_models_and_health(stub, model_name):
    models = stub.ListModels(omni_pb2.ListModelsRequest(), timeout=10)
    assert [m.id for m in models.models] == [model_name]
    assert "audio" in models.models[0].output_modalities
    assert stub.Health(omni_pb2.HealthRequest(), timeout=10).status == "ok"


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda r: setattr(r, "model", "nope"), "does not exist"),
        (lambda r: r.ClearField("messages"), "messages must not be empty"),
        (lambda r: r.modalities.append("video"), "unsupported modalities"),
        (
            lambda r: r.messages[0].content.append(
                omni_pb2.ContentPart(image=omni_pb2.ImagePart(data=b"not an image"))
            ),
            "image could not be decoded",
        ),
        (
            lambda r: r.messages[0].content.append(
                omni_pb2.ContentPart(audio=omni_pb2.AudioPart(data=b"RIFFxx", format="wav"))
            ),
            "audio could not be decoded",
        ),
    ],
)
def test_invalid_argument(stub, model_name, mutate, needle):
    req = _request(model_name, omni_pb2.ContentPart(text="Hello"))
    mutate(req)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Chat(req, timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in e.value.details()
    # ...and the server keeps serving.
    assert list(stub.Chat(_request(model_name, omni_pb2.ContentPart(text="Hi"), max_tokens=2), timeout=30))
