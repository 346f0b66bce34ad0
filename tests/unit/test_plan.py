from omni.v1 import omni_pb2

from services.router.plan import plan


def _req(*parts, modalities=("text",)):
    return omni_pb2.ChatRequest(
        messages=[omni_pb2.Message(role="user", content=list(parts))], modalities=modalities
    )


TEXT = omni_pb2.ContentPart(text="hi")
IMAGE = omni_pb2.ContentPart(image=omni_pb2.ImagePart(data=b"x"))
AUDIO = omni_pb2.ContentPart(audio=omni_pb2.AudioPart(data=b"x"))


def test_text_only_skips_encoder_and_speech():
    p = plan(_req(TEXT))
    assert (p.request_class, p.encode, p.speak) == ("text", False, False)


def test_audio_out_plans_talker_and_vocoder():
    assert plan(_req(TEXT, modalities=("text", "audio"))).speak


def test_classes():
    assert plan(_req(IMAGE)).request_class == "image"
    assert plan(_req(*[IMAGE] * 5)).request_class == "document"
    assert plan(_req(IMAGE, AUDIO)).request_class == "audio"
    assert plan(_req(IMAGE)).encode
