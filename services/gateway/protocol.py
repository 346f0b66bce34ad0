"""The OpenAI wire format's shared pieces: request bodies and forms read within their limits,
validation into typed models (a 422 naming the field), names and bounds, and content parts (text,
images, audio) as the pipeline's typed parts. Each API's own request and rendering live in its
folder (chat/, responses/, audio/, realtime/)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartException, MultiPartParser

from services.common import untrusted_json
from services.common.errors import OmniError, bad_request, too_large
from services.models.profile import LimitsSpec
from services.pipeline import media
from services.pipeline.checks import MAX_STOP_CHARS
from services.pipeline.documents import file_data, pdf_document
from services.pipeline.turn import Part
from services.pipeline.video_input import video_input

INT32_MAX = 2**31 - 1
MAX_NAME_CHARS = 256  # model, voice, service tier: names, never free text
MAX_DESCRIPTION_CHARS = 4096
MAX_ARGUMENTS_CHARS = 65_536
MAX_FORM_FIELDS = 16
IMAGE_DETAILS = ("auto", "low", "high")
M = TypeVar("M", bound=BaseModel)


class Loose(BaseModel):
    # Unknown OpenAI parameters are accepted and ignored, as vLLM does.
    model_config = ConfigDict(extra="allow")


Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class MmProcessorKwargs(Loose):
    """vLLM's per-request processor options (`mm_processor_kwargs`); the one omniray reads."""

    use_audio_in_video: bool = False


class AudioParam(Loose):
    voice: Name = "default"
    format: Literal["pcm16", "wav", "mp3", "opus", "flac", "aac"] = "pcm16"


def parse_body(raw: bytes) -> Any:
    """The request body as JSON, within untrusted_json's limits."""
    try:
        return untrusted_json.loads(raw)
    except untrusted_json.JsonLimitError as e:
        raise bad_request(f"request body: {e.message}", code=e.code) from None


async def parse_form(body: bytes, headers: Headers, *, max_files: int, max_part_size: int) -> FormData:
    """A multipart form (Starlette's parser over the body already read within its limit); the
    caller closes it."""

    async def stream() -> AsyncIterator[bytes]:
        yield body

    try:
        return await MultiPartParser(
            headers, stream(), max_files=max_files, max_fields=MAX_FORM_FIELDS, max_part_size=max_part_size
        ).parse()
    except MultiPartException as e:
        raise bad_request(f"multipart form: {str(e)[:200]}", code="invalid_form") from None


def validated(model: type[M], body: Any) -> M:
    """`body` as `model`, or a 422 naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        raise OmniError(422, f"{param}: {first['msg']}", code="invalid_value", param=param) from None


def content_part(part: dict, param: str, limits: LimitsSpec, *, use_audio_in_video: bool = False) -> Part:
    """One OpenAI content part as the pipeline's. `use_audio_in_video` (vLLM's request option,
    `mm_processor_kwargs`): a clip's audio track is given to the model too."""
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise bad_request("text part needs a string 'text'", param=param)
        return part["text"]
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise bad_request("image_url part needs image_url.url", param=param)
        detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
        if detail not in IMAGE_DETAILS:
            raise bad_request(
                f"image_url.detail must be one of {IMAGE_DETAILS}", param=f"{param}.image_url.detail"
            )
        data = media.data_url_bytes(url, param=param, limit=limits.max_image_bytes)
        return media.image_input(data, detail, limits, param=param)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise bad_request("input_audio part needs input_audio.data (base64)", param=param)
        fmt = audio.get("format", "wav")
        if fmt not in media.AUDIO_FORMATS:
            raise bad_request(
                f"input_audio.format must be one of {media.AUDIO_FORMATS}",
                code="invalid_audio_format",
                param=f"{param}.input_audio.format",
            )
        if len(audio["data"]) * 3 // 4 > limits.max_audio_bytes:
            raise too_large(
                f"audio is larger than {limits.max_audio_bytes} bytes", code="audio_too_large", param=param
            )
        return media.audio_clip(media.b64decode(audio["data"], param=param), fmt, limits, param=param)
    if kind == "video_url":
        video = part.get("video_url")
        url = video.get("url") if isinstance(video, dict) else video
        if not isinstance(url, str):
            raise bad_request("video_url part needs video_url.url", param=param)
        data = media.data_url_bytes(url, param=param, limit=limits.max_video_bytes, what="video")
        return video_input(data, limits, with_audio=use_audio_in_video, param=param)
    if kind == "file":
        file = part.get("file")
        if not isinstance(file, dict):
            raise bad_request("file part needs file.file_data (a PDF, base64)", param=param)
        if file.get("file_id") is not None:
            raise bad_request(
                "file_id is not supported (there is no files API); send file.file_data",
                code="unsupported_file_id",
                param=f"{param}.file.file_id",
            )
        return pdf_document(file_data(file.get("file_data"), limits, param=param), limits, param=param)
    raise bad_request(
        "unsupported content part type; supported: text, image_url, input_audio, video_url, file",
        code="unsupported_content_type",
        param=param,
    )
