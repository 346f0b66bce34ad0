"""The talker and vocoder as a response uses them: one talker stream to PCM at OUTPUT_RATE, its
units vocoded as they arrive (async chunk) with the context that makes chunked audio equal a
whole-utterance decode; text to speech alone (the audio speech endpoints)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import numpy as np
from omni.v1 import stages_pb2

from services.common.redis_config import async_client
from services.dataplane import tensors, token_stream
from services.models.profile import Profile
from services.pipeline.events import Event
from services.pipeline.prepared import Prepared
from services.pipeline.prompt import PromptBuilder, expanded_ids
from services.pipeline.resampler import OUTPUT_RATE, StreamResampler
from services.pipeline.stage_calls import StageHandles
from services.pipeline.stage_deadlines import StageDeadlines
from services.pipeline.text_chunker import TextChunker
from services.pipeline.vocoder_window import VocodeCall, VocoderWindow

# Without async chunk, whole-utterance audio is still sent to the client in pieces of this length.
WHOLE_AUDIO_PIECE_S = 0.5


class Speaking:
    def __init__(
        self,
        profile: Profile,
        handles: StageHandles,
        deadlines: StageDeadlines,
        prompts: PromptBuilder,
        async_chunk: bool,
    ):
        self.profile, self.h, self.deadlines, self.prompts = profile, handles, deadlines, prompts
        self.async_chunk = async_chunk
        self.token_talker = profile.token_talker()
        self._token_redis = None  # speech on a token talker: the token streams it writes (made on use)

    async def speak_text(self, p: Prepared, text: str, out: asyncio.Queue) -> None:
        """Text to speech alone: a token talker reads its tokens, a text talker its pieces."""
        if self.token_talker:
            await self._speak_tokens(p, text, out)
        else:
            for index, piece in enumerate(_spoken_pieces(text, self.profile)):
                talk = stages_pb2.TalkRequest(ctx=p.ctx, text=piece, voice=p.voice, chunk_index=index)
                await self.voice(p, talk, out, lambda: None)
        await self.end_speech(p, out)

    async def voice(self, p: Prepared, talk: stages_pb2.TalkRequest, out: asyncio.Queue, transcript) -> bool:
        """One talker stream to PCM: with async chunk its units are vocoded as they arrive, each call
        with the context that makes it equal to a whole-utterance decode; without, each stage waits
        for the whole output of the one before (the baseline). `transcript()` gives the text that
        goes with the next audio. Whether the talker's frame limit cut the speech."""
        vocoder = self.profile.models.vocoder  # present: validation rejected audio out otherwise
        talked = self.h.talker.options(stream=True).Talk.remote(talk)
        if talk.HasField("thinker"):  # a token talker waits on the thinker's tokens as well
            gap, d = self.profile.pipeline.thinker_gap_s(), self.deadlines
            talked = d.stream("talker", talked, reply_s=gap + d.reply_s, between_s=gap + d.between_s)
        else:
            talked = self.deadlines.stream("talker", talked)
        truncated = False

        async def units_of() -> AsyncIterator[np.ndarray]:
            nonlocal truncated
            async for uc in talked:
                if uc.is_final:
                    truncated = uc.truncated
                else:
                    yield await tensors.materialized(uc.units)

        units = units_of()
        if self.async_chunk:
            window = VocoderWindow(vocoder.context_frames, vocoder.lookahead_frames)
            async for chunk in units:
                if call := window.push(chunk):
                    await self._vocode(p, call, out, transcript())
            if call := window.flush():
                await self._vocode(p, call, out, transcript())
        else:
            whole = [u async for u in units]
            if whole:
                call = VocodeCall(np.concatenate(whole), None, None)
                await self._vocode(p, call, out, transcript(), split_s=WHOLE_AUDIO_PIECE_S)
        return truncated

    async def _vocode(
        self,
        p: Prepared,
        call: VocodeCall,
        out: asyncio.Queue,
        transcript: str | None,
        split_s: float | None = None,
    ) -> None:
        req = stages_pb2.VocodeRequest(ctx=p.ctx, units=tensors.describe(call.units), voice=p.voice)
        if call.left is not None:
            req.left_context.CopyFrom(tensors.describe(call.left))
        if call.right is not None:
            req.right_context.CopyFrom(tensors.describe(call.right))
        chunk = await self.deadlines.reply("vocoder", self.h.vocoder.Vocode.remote(req))
        p.resampler = p.resampler or StreamResampler(chunk.sample_rate)
        pcm = p.resampler.push(chunk.pcm16)
        step = len(pcm) if split_s is None else max(2, int(split_s * OUTPUT_RATE) * 2)
        for k in range(0, len(pcm), step):
            await out.put(
                Event(
                    pcm16=pcm[k : k + step],
                    sample_rate=OUTPUT_RATE,
                    transcript=transcript if k == 0 else None,
                )
            )

    @staticmethod
    async def end_speech(p: Prepared, out: asyncio.Queue) -> None:
        """The last samples the response's resampler held back."""
        if p.resampler is not None and (pcm := p.resampler.flush()):
            await out.put(Event(pcm16=pcm, sample_rate=OUTPUT_RATE))

    async def _speak_tokens(self, p: Prepared, text: str, out: asyncio.Queue) -> None:
        """A token talker reads the text's tokens from a token stream, written here as decode would
        write an answer's."""
        stream = token_stream.key(p.ctx.request_id)
        ids, placements = expanded_ids(p.prompt)
        talk = stages_pb2.TalkRequest(
            ctx=p.ctx,
            voice=p.voice,
            thinker=stages_pb2.ThinkerOutput(prompt_ids=ids, media=placements, token_stream=stream),
        )
        self._token_redis = self._token_redis or async_client()
        writer = token_stream.TokenStreamWriter(stream, self._token_redis)
        answer = self.prompts.tokenizer.encode(text, add_special_tokens=False)
        await writer.add(answer)
        await writer.end()
        await self.voice(p, talk, out, lambda: None)


_CLAUSE = re.compile(r"\S+\s*")


def _spoken_pieces(text: str, profile: Profile) -> list[str]:
    """Text for a text talker, cut where chat answers are cut (clause boundaries, a few words on):
    the first audio comes after the first clause, not the whole text."""
    chunker = TextChunker(profile.pipeline.chunk_min_tokens, profile.pipeline.chunk_max_tokens)
    pieces = [piece for word in _CLAUSE.findall(text) if (piece := chunker.push(word, 1))]
    if (rest := chunker.flush()) and rest.strip():
        pieces.append(rest)
    return pieces
