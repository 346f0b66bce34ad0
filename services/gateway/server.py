"""The gateway deployment: OpenAI-compatible REST (FastAPI ingress) and gRPC `omni.v1.Omni`, both in
front of the one Pipeline. Each API has its folder (routes' work, protocol, rendering): chat/,
responses/, audio/, realtime/; here are the routes and what they share (errors, the console, models,
health)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from omni.v1 import omni_pb2
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common.errors import OmniError, internal_error
from services.gateway.audio.api import AudioAPI
from services.gateway.chat.api import ChatAPI
from services.gateway.observer import RequestObserver
from services.gateway.quota import quota_service
from services.gateway.realtime.api import RealtimeAPI
from services.gateway.responses.api import ResponsesAPI
from services.models.profile import Profile
from services.pipeline.pipeline import Pipeline
from services.pipeline.prompt import PromptBuilder
from services.pipeline.stage_calls import StageHandles
from services.realtime.hub import RealtimeHub

api = FastAPI(title="omniray", docs_url=None, redoc_url=None)


@api.exception_handler(OmniError)
async def _omni_error(_: Request, e: OmniError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
    # Starlette's own answers (unknown path, wrong method) in OpenAI's shape too.
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_request")
    err = OmniError(e.status_code, str(e.detail), code=code)
    return JSONResponse(err.body(), status_code=e.status_code, headers=e.headers)


@api.exception_handler(Exception)
async def _unexpected(_: Request, e: Exception) -> JSONResponse:
    err = internal_error(e)
    return JSONResponse(err.body(), status_code=err.status)


CONSOLE_DIR = Path(__file__).parent / "console"
CONSOLE_FILES = {"index.html": "text/html", "console.js": "text/javascript", "console.css": "text/css"}
# The page loads only its own files and talks only to this gateway; microphone audio and the
# answer's stream are media, images the user picks are data: URLs.
CONSOLE_CSP = ("default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob: mediastream:; "
               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")  # fmt: skip


def _console_file(name: str) -> Response:
    if name not in CONSOLE_FILES:
        raise OmniError(404, "no such console file", code="not_found")
    return Response((CONSOLE_DIR / name).read_bytes(), media_type=CONSOLE_FILES[name],
                    headers={"content-security-policy": CONSOLE_CSP, "cache-control": "no-cache",
                             "x-content-type-options": "nosniff"})  # fmt: skip


async def _grpc_status(chunks: AsyncIterator, grpc_context, what: str) -> AsyncIterator:
    """A gRPC method's chunks; every failure leaves with a status code and details set here
    (Serve's proxy would otherwise send INTERNAL with the exception's text)."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as e:
        err = e if isinstance(e, OmniError) else internal_error(e, what)
        if grpc_context is None:
            raise err from None
        grpc_context.set_code(err.grpc_code)
        # Serve's proxy does not forward a replica's trailing metadata on errors, so the
        # rate-limit headers ride in the details, after the message: "msg [k=v; k=v]".
        headers = "; ".join(f"{k}={v}" for k, v in err.headers.items())
        grpc_context.set_details(f"{err.message} [{headers}]" if headers else err.message)
        raise err from None


@serve.deployment
@serve.ingress(api)
class Gateway:
    def __init__(
        self,
        profile: dict,
        video: DeploymentHandle,
        encoder: DeploymentHandle,
        prefill: DeploymentHandle,
        decode: DeploymentHandle,
        talker: DeploymentHandle,
        vocoder: DeploymentHandle,
        realtime_decode: DeploymentHandle | None = None,
        async_chunk: bool | None = None,
    ):
        self.profile = Profile.model_validate(profile)
        handles = StageHandles.of(video, encoder, prefill, decode, talker, vocoder, realtime_decode)
        prompts = PromptBuilder(str(self.profile.model_path(self.profile.models.thinker)))
        self.quota = quota_service()
        self.pipeline = Pipeline(self.profile, handles, prompts, self.quota, async_chunk=async_chunk)
        self.realtime_hub = RealtimeHub(self.pipeline, self.profile, self.quota)
        if self.quota.metrics is not None and self.quota.metrics.load is not None:
            self.quota.metrics.load.sessions = lambda: len(self.realtime_hub.monitor)
        observer = RequestObserver(self.quota)
        self.chat = ChatAPI(self.profile, self.pipeline, observer)
        self.responses_api = ResponsesAPI(self.profile, self.pipeline, observer)
        self.audio = AudioAPI(self.profile, self.pipeline, observer)
        self.realtime_api = RealtimeAPI(self.profile, self.realtime_hub, self.quota, observer)

    # ---- REST ---------------------------------------------------------------------------

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self.chat.rest(request)

    @api.post("/v1/responses")
    async def responses(self, request: Request):
        return await self.responses_api.rest(request)

    @api.post("/v1/audio/speech")
    async def audio_speech(self, request: Request):
        return await self.audio.speech(request)

    @api.post("/v1/audio/transcriptions")
    async def audio_transcriptions(self, request: Request):
        return await self.audio.transcriptions(request)

    @api.post("/v1/realtime/client_secrets")
    async def client_secrets(self, request: Request):
        return await self.realtime_api.client_secrets(request)

    @api.post("/v1/realtime/calls")
    async def realtime_call(self, request: Request):
        return await self.realtime_api.call(request)

    @api.post("/v1/realtime/calls/{call_id}/hangup")
    async def realtime_hangup(self, call_id: str, request: Request):
        return await self.realtime_api.hang_up(call_id, request)

    @api.websocket("/v1/realtime")
    async def realtime(self, ws: WebSocket):
        await self.realtime_api.websocket(ws)

    @api.get("/console")
    async def console(self):
        """The voice console: talk to the model from a browser (services/gateway/console/)."""
        return _console_file("index.html")

    @api.get("/console/{name}")
    async def console_asset(self, name: str):
        return _console_file(name)

    @api.get("/v1/models")
    async def models(self):
        card = self._model_card()
        # an alias is the same model under another name (vLLM's `root`: what it serves)
        aliases = [{**card, "id": name, "root": card["id"]} for name in self.profile.aliases.models]
        return {"object": "list", "data": [card, *aliases]}

    def _model_card(self) -> dict:
        m = self.profile.models
        inputs = ["text"] + (["image"] if m.vision else []) + (["audio"] if m.audio else [])
        outputs = ["text"] + ([] if self.profile.speech_out_unavailable() else ["audio"])
        return {
            "id": self.profile.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "omniray",
            "input_modalities": inputs,
            "output_modalities": outputs,
            "root": self.profile.served_model_name,
            # omniray's: the voices `audio.voice` takes (a token talker's are its speakers), then
            # the other names they answer to (profile `aliases.voices`)
            "voices": self.profile.voice_names() if "audio" in outputs else [],
        }

    @api.get("/health")
    async def health(self):
        return {"status": "ok", "profile": self.profile.name}

    # ---- gRPC (omni.v1.Omni through Serve's gRPC proxy) -----------------------------------

    async def Chat(
        self, request: omni_pb2.ChatRequest, grpc_context=None
    ) -> AsyncIterator[omni_pb2.ChatChunk]:
        """omni.v1.Omni/Chat."""
        async for chunk in _grpc_status(
            self.chat.grpc(request, grpc_context), grpc_context, "gRPC chat failed"
        ):
            yield chunk

    async def Realtime(
        self, request_stream: AsyncIterator[omni_pb2.RealtimeClientEvent], grpc_context=None
    ) -> AsyncIterator[omni_pb2.RealtimeServerEvent]:
        """omni.v1.Omni/Realtime: the WebSocket's session over a bidirectional gRPC stream."""
        async for event in self.realtime_api.grpc(request_stream, grpc_context):
            yield event

    async def Speech(
        self, request: omni_pb2.SpeechRequest, grpc_context=None
    ) -> AsyncIterator[omni_pb2.SpeechChunk]:
        """omni.v1.Omni/Speech: POST /v1/audio/speech's file, in chunks."""
        speech = self.audio.grpc_speech(request, grpc_context)
        async for chunk in _grpc_status(speech, grpc_context, "gRPC speech failed"):
            yield chunk

    async def Transcribe(
        self, request: omni_pb2.TranscriptionRequest, grpc_context=None
    ) -> AsyncIterator[omni_pb2.TranscriptionChunk]:
        """omni.v1.Omni/Transcribe: a chunk per segment, then the text with usage."""
        transcribed = self.audio.grpc_transcribe(request, grpc_context)
        async for chunk in _grpc_status(transcribed, grpc_context, "gRPC transcription failed"):
            yield chunk

    async def ListModels(self, request: omni_pb2.ListModelsRequest) -> omni_pb2.ListModelsResponse:
        card = self._model_card()
        return omni_pb2.ListModelsResponse(
            models=[
                omni_pb2.ModelCard(
                    id=card["id"],
                    owned_by=card["owned_by"],
                    input_modalities=card["input_modalities"],
                    output_modalities=card["output_modalities"],
                )
            ]
        )

    async def Health(self, request: omni_pb2.HealthRequest) -> omni_pb2.HealthResponse:
        return omni_pb2.HealthResponse(status="ok")
