"""Qwen3-Omni's talker as a streaming stage model: the thinker's tokens in, as it writes them; codec
frames (16 codes each, 12.5 a second) out, as the talker writes them — every stream of a replica in
one batched step (services/models/qwen3_omni/talker_batch.py, driven by services/models/stream_loop.py).

Weights: the `talker.` tensors of the model's checkpoint and the thinker's token embedding table
(`thinker.model.embed_tokens.`), loaded alone into transformers' modules. The inputs are built as
transformers' `Qwen3OmniMoeForConditionalGeneration.generate` builds them, from what the thinker
gives (tests/contracts/test_qwen3_omni_talker.py: the frames equal transformers' for the same
thinker output and seed):

- the user turns of the prompt: the thinker's hidden states at layer `accept_hidden_layer` where the
  prompt holds image/audio/video placeholders, its token embeddings elsewhere, each projected into
  the talker (`hidden_projection` / `text_projection`);
- the assistant turn: its three template tokens and the first generated token, with the codec's
  control codes and the speaker's id (the voice);
- then one generated token's embedding per talker step (the text still to speak), `tts_eos` where
  the thinker ended — or where a stop token came (a tool call's marker: the call is not spoken) —
  and `tts_pad` after it.

The talker starts on the thinker's first token and needs token k+2 only at its step k, so it
streams while the thinker writes (async chunk); a stream steps when the text it needs is there
(`TalkerStream.feed` / `finish`). Generation is greedy or sampled (top-k 50, top-p 1.0, temperature
0.9, repetition penalty 1.05 by default, as the model's generate), each stream with its own settings;
a stream given a seed draws from its own generator, so its frames depend on the seed and its input
only (the request's `seed`), whoever steps beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import ThinkerPrompt
from services.models.qwen3_omni import checkpoint
from services.models.qwen3_omni.sampling import Sampling
from services.models.stream_loop import Stream, StreamLoop

__all__ = ["Sampling", "Talker", "TalkerStream", "TAIL_FRAMES"]

ASSISTANT_TEMPLATE_TOKENS = 3  # <|im_start|> assistant \n
TAIL_FRAMES = 12  # ~1 s of speech past the text's share (Sampling.max_frames_per_token)
# What a stream reads at a step once its text is spoken (Talker.tts_eos / tts_pad).
EOS, PAD = -1, -2


class Talker:
    def __init__(self, path: Path, options: o.Qwen3OmniTalker):
        import torch
        from transformers import AutoConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerForConditionalGeneration,
        )

        from services.models.qwen3_omni.talker_batch import TalkerBatch

        config = AutoConfig.from_pretrained(path)
        # transformers 5.19: the talker's M-RoPE over audio reads `audio_config` from its own config,
        # which the checkpoint's talker config does not carry (fixed in the thinker's).
        config.talker_config.audio_config = config.thinker_config.audio_config
        self.config = config
        self.model = checkpoint.module(
            Qwen3OmniMoeTalkerForConditionalGeneration, config.talker_config, path, "talker.", options.dtype
        )
        p = next(self.model.parameters())
        self.embed = checkpoint.tensors(path, "thinker.model.embed_tokens.")["weight"].to(p.device, p.dtype)
        self.voices = dict(config.talker_config.speaker_id)  # name -> speaker id
        self.codebooks = config.talker_config.num_code_groups
        t = config.talker_config
        self.media_ids = {t.audio_token_id, t.image_token_id, t.video_token_id}
        vocab = t.text_config.vocab_size
        self.suppressed = tuple(i for i in range(vocab - 1024, vocab) if i != t.codec_eos_token_id)
        with torch.inference_mode():
            tts = torch.tensor([config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id])
            self.tts_bos, self.tts_eos, self.tts_pad = self.model.text_projection(
                self.embed[tts.to(p.device)]
            )[:, None].unbind(0)  # each [1, hidden]
        self.version = f"qwen3-omni-talker:{path.name}"
        self.chunk_frames = list(options.chunk_frames)
        self.sampling = Sampling(
            max_frames=options.max_frames, max_frames_per_token=options.max_frames_per_token
        )
        self.batch = TalkerBatch(self, options.max_streams, "inductor" if options.compile else None)
        self.loop = StreamLoop(
            self.batch,
            "talker",
            options.max_streams,
            options.step_batch,
            p.is_cuda if options.async_output is None else options.async_output,
            options.cpu_threads,
        )

    def stream(
        self,
        prompt: ThinkerPrompt,
        voice: str,
        seed: int | None = None,
        stop_token_ids: Iterable[int] = (),
        sampling: Sampling | None = None,
    ) -> TalkerStream:
        if voice not in self.voices:
            raise ValueError(f"unknown voice {voice!r}; this talker has {sorted(self.voices)}")
        ends = {self.config.im_end_token_id, *stop_token_ids}
        return TalkerStream(self, prompt, self.voices[voice], sampling or self.sampling, seed, ends)

    def prefill_embeds(self, prompt: ThinkerPrompt, speaker_id: int, first: int):
        """The user turns and the assistant's opening, as transformers' generate builds them:
        ([1, n, hidden] embeddings, [1, n] the ids its M-RoPE reads)."""
        import torch

        cfg, model = self.config, self.model
        ids = prompt.token_ids
        device = self.embed.device
        role, previous_start = [], 0
        for i, tok in enumerate(ids):
            if tok == cfg.im_start_token_id:
                previous_start = i
            role.append(ids[min(previous_start + 1, len(ids) - 1)])
        user = [i for i, r in enumerate(role) if r == cfg.user_token_id]
        media = [i for i, tok in enumerate(ids) if tok in self.media_ids]
        rows = {}
        if media:
            hidden = torch.from_numpy(np.ascontiguousarray(prompt.media_hidden)).to(device, self.embed.dtype)
            if hidden.shape[0] != len(media):
                raise ValueError(f"{hidden.shape[0]} media hidden states for {len(media)} placeholders")
            rows = dict(zip(media, model.hidden_projection(hidden), strict=True))
        text = [i for i in user if i not in rows]
        projected = dict(zip(text, model.text_projection(self.embed[torch.tensor([ids[i] for i in text], device=device)]),
                             strict=True)) if text else {}  # fmt: skip
        user_part = (
            torch.stack([rows[i] if i in rows else projected[i] for i in user])[None] if user else None
        )

        starts = [
            i
            for i in range(len(ids) - 1)
            if ids[i] == cfg.im_start_token_id and ids[i + 1] == cfg.assistant_token_id
        ]
        if not starts or len(ids) - starts[-1] != ASSISTANT_TEMPLATE_TOKENS:
            raise ValueError("the prompt must end with the assistant's opening (<|im_start|>assistant\\n)")
        opening = ids[starts[-1] :] + [first]
        a = model.text_projection(self.embed[torch.tensor(opening, device=device)])[None]  # [1, 4, h]
        text_part = torch.cat(
            [a[:, :3], self.tts_pad.expand(4, -1)[None], self.tts_bos[None], a[:, 3:4]], dim=1
        )
        tc = cfg.talker_config
        codes = torch.tensor([[tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id, speaker_id,
                               tc.codec_pad_id, tc.codec_bos_id]], device=device)  # fmt: skip
        codec_part = torch.cat(
            [torch.zeros((1, 3, text_part.shape[-1]), device=device, dtype=text_part.dtype),
             model.get_input_embeddings()(codes)], dim=1)  # fmt: skip
        assistant = text_part + codec_part
        embeds = assistant if user_part is None else torch.cat([user_part, assistant], dim=1)
        talker_ids = [ids[i] for i in user] + [cfg.tts_pad_token_id] * assistant.shape[1]
        return embeds, torch.tensor([talker_ids], device=device)

    def text_embeds(self, reads: list[int]):
        """[rows, 1, hidden]: what each row reads at its step — a generated token's projected
        embedding, or EOS / PAD (`TalkerStream.reads`)."""
        import torch

        out = torch.empty(
            (len(reads), 1, self.tts_pad.shape[-1]), device=self.embed.device, dtype=self.embed.dtype
        )
        tokens = [i for i, r in enumerate(reads) if r >= 0]
        if tokens:
            ids = torch.tensor([reads[i] for i in tokens], device=self.embed.device)
            out[tokens, 0] = self.model.text_projection(self.embed[ids])
        for i, r in enumerate(reads):
            if r == EOS:
                out[i] = self.tts_eos
            elif r == PAD:
                out[i] = self.tts_pad
        return out


class TalkerStream(Stream):
    """One response's talker: `feed` the thinker's tokens as they come, `finish` when it is done;
    `frames()` / `aframes()` yield [1, 16] int64 codes as the talker writes them."""

    def __init__(
        self,
        talker: Talker,
        prompt: ThinkerPrompt,
        speaker_id: int,
        sampling: Sampling,
        seed: int | None,
        ends: set[int],
    ):
        super().__init__()
        self.t, self.prompt, self.speaker_id, self.sampling, self.seed = (
            talker,
            prompt,
            speaker_id,
            sampling,
            seed,
        )
        self._tokens: list[int] = []
        self._finished = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._ends = ends  # tokens that end the text: the thinker's eos, a tool call's marker
        self._end_at: int | None = None  # the first of them fed, once there is one

    def loop(self) -> StreamLoop:
        return self.t.loop

    # ---- the thinker's side ---------------------------------------------------------------------

    def feed(self, token_ids: list[int]) -> None:
        with self._lock:
            if self._end_at is None:
                end = next((i for i, t in enumerate(token_ids) if t in self._ends), None)
                if end is not None:
                    self._end_at = len(self._tokens) + end
            self._tokens.extend(token_ids)
        self.changed()

    def set_media_hidden(self, rows: np.ndarray) -> None:
        with self._lock:
            self.prompt.media_hidden = rows

    @property
    def text_ended(self) -> bool:
        """A token that ends the text has come: nothing the thinker writes after it is read."""
        with self._lock:
            return self._end_at is not None

    def finish(self, error: BaseException | None = None) -> None:
        with self._lock:
            self._finished = True
            self._error = self._error or error
        self.changed()

    # ---- what the talker reads --------------------------------------------------------------------

    def _needs(self) -> int:
        """The thinker's tokens the next step needs: the first to join; token k+2 at step k (as the
        model's generate reads the thinker's output, the last generated token is not read)."""
        return 1 if self.state is None else self.state.step + 3

    def ready(self) -> bool:
        with self._lock:
            if self._end_at is not None:  # the text is whole: what the thinker writes after is not read
                return True
            if len(self._tokens) >= self._needs() or self._finished:
                if self._error is not None:
                    raise self._error
                return True
            return False

    def waiting_for(self) -> str:
        return f"the thinker's token {self._needs() - 1}"

    def _text(self) -> tuple[list[int], bool]:
        """The text as far as it is read (up to the token that ends it, which is not read), and
        whether it is whole."""
        with self._lock:
            if self._end_at is not None:
                return self._tokens[: self._end_at + 1], True
            return list(self._tokens), self._finished

    def first(self) -> int:
        """The token the talker opens with; an empty text (or one that ends at once: a call's marker
        first) opens as the eos would."""
        tokens, _ = self._text()
        with self._lock:
            at_once = self._end_at == 0
        return tokens[0] if tokens and not at_once else self.t.config.im_end_token_id

    def reads(self, step: int) -> int:
        """What step `step` reads: generated token step+1 while more follows it, EOS at the end, PAD
        after."""
        tokens, ended = self._text()
        end = max(len(tokens) - 2, 0) if ended else step + 1
        if step < end:
            return tokens[step + 1]
        return EOS if step == end else PAD

    def over_budget(self, step: int) -> bool:
        """Past its share of frames for a text that has ended (Sampling.max_frames_per_token)."""
        per_token = self.sampling.max_frames_per_token
        with self._lock:
            ended = self._finished or self._end_at is not None
            said = len(self._tokens) if self._end_at is None else self._end_at + 1
        return bool(per_token and ended and step + 1 >= per_token * said + TAIL_FRAMES)


def verify(path: Path, options: o.Qwen3OmniTalker) -> None:
    checkpoint.verify(path, "talker_config")


def prepare(dest: Path, options: o.Qwen3OmniTalker) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniTalker) -> Talker:
    return Talker(path, options)
