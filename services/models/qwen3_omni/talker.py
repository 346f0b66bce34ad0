"""Qwen3-Omni's talker as a streaming stage model: the thinker's tokens in, as it writes them; codec
frames (16 codes each, 12.5 a second) out, as the talker writes them.

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
streams while the thinker writes (async chunk); a step waits for the text it needs
(`TalkerStream.feed` / `finish`). Generation is transformers' own modules step by step (talker,
code predictor, logits processors), greedy or sampled (top-k 50, top-p 1.0, temperature 0.9,
repetition penalty 1.05 by default, as the model's generate). A stream given a seed draws from its
own random state, so its frames depend on the seed and its input only (the request's `seed`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import ThinkerPrompt
from services.models.qwen3_omni import checkpoint

ASSISTANT_TEMPLATE_TOKENS = 3  # <|im_start|> assistant \n
TAIL_FRAMES = 12  # ~1 s of speech past the text's share (Sampling.max_frames_per_token)
# One talker step at a time in a process: the talker keeps its M-RoPE offset on the module, and a
# seeded stream swaps its random state into torch's generators (transformers' generate, which the
# code predictor runs, draws from those), so no other stream's draw may come between.
_STEP = threading.Lock()


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    max_frames: int = 4096  # codes drawn at most (transformers' talker_max_new_tokens)
    # and at most this many per token of the text once it is known, plus TAIL_FRAMES (0: no bound)
    max_frames_per_token: int = 0


class Talker:
    def __init__(self, path: Path, options: o.Qwen3OmniTalker):
        import torch
        from transformers import AutoConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerForConditionalGeneration,
        )

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
        self.suppressed = [i for i in range(vocab - 1024, vocab) if i != t.codec_eos_token_id]
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
        sampling = sampling or self.sampling
        rng = _Rng(seed, self.embed.device) if seed is not None else None
        ends = {self.config.im_end_token_id, *stop_token_ids}
        return TalkerStream(self, prompt, self.voices[voice], sampling, rng, ends)


class _Rng:
    """A seeded stream's random state (CPU and its device's), as `torch.manual_seed(seed)` leaves it
    and as its draws advance it; swapped into torch's generators for each of the stream's steps."""

    def __init__(self, seed: int, device):
        import torch

        self.devices = [device.index or 0] if device.type == "cuda" else []
        # under _STEP: seeding goes through torch's generators, which a stepping stream may hold
        # (its state swapped in) — the fork's restore would roll its draws back
        with _STEP, torch.random.fork_rng(self.devices):
            torch.manual_seed(seed)
            self.states = self._current()

    def _current(self) -> list:
        import torch

        return [torch.get_rng_state()] + [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        import torch

        with torch.random.fork_rng(self.devices):  # torch's own state is back afterwards
            torch.set_rng_state(self.states[0])
            for device, state in zip(self.devices, self.states[1:], strict=True):
                torch.cuda.set_rng_state(state, device)
            yield
            self.states = self._current()


class TalkerStream:
    """One response's talker: `feed` the thinker's tokens as they come, `finish` when it is done;
    `frames()` yields [n, 16] int64 codes as the talker writes them."""

    def __init__(
        self,
        talker: Talker,
        prompt: ThinkerPrompt,
        speaker_id: int,
        sampling: Sampling,
        rng: _Rng | None,
        ends: set[int],
    ):
        self.t, self.prompt, self.speaker_id, self.sampling = talker, prompt, speaker_id, sampling
        self._rng = rng
        self._tokens: list[int] = []
        self._finished = False
        self._error: BaseException | None = None
        self.ended_by = ""  # codec_eos | text_budget | max_frames, once frames() has returned
        self._more = threading.Condition()
        self._ends = ends  # tokens that end the text: the thinker's eos, a tool call's marker
        self._end_at: int | None = None  # the first of them fed, once there is one

    # ---- the thinker's side ---------------------------------------------------------------------

    def feed(self, token_ids: list[int]) -> None:
        with self._more:
            if self._end_at is None:
                end = next((i for i, t in enumerate(token_ids) if t in self._ends), None)
                if end is not None:
                    self._end_at = len(self._tokens) + end
            self._tokens.extend(token_ids)
            self._more.notify_all()

    def set_media_hidden(self, rows: np.ndarray) -> None:
        with self._more:
            self.prompt.media_hidden = rows

    @property
    def text_ended(self) -> bool:
        """A token that ends the text has come: nothing the thinker writes after it is read."""
        with self._more:
            return self._end_at is not None

    def finish(self, error: BaseException | None = None) -> None:
        with self._more:
            self._finished = True
            self._error = self._error or error
            self._more.notify_all()

    def _generated(self, n: int, timeout: float | None) -> tuple[list[int], bool]:
        """The thinker's tokens once it has written `n` of them or ended (up to the first token
        that ends the text, which is not read: as the thinker's eos), and whether it has ended."""
        with self._more:
            ok = self._more.wait_for(
                lambda: len(self._tokens) >= n or self._finished or self._end_at is not None, timeout
            )
            if not ok:
                raise TimeoutError(f"the thinker wrote no token {n - 1} within {timeout} s")
            if self._end_at is not None:  # the text is whole: what the thinker writes after is not read
                return self._tokens[: self._end_at + 1], True
            if self._error is not None:
                raise self._error
            return list(self._tokens), self._finished

    # ---- the talker -----------------------------------------------------------------------------

    def _prefill_embeds(self, first: int):
        """The user turns and the assistant's opening, as transformers' generate builds them."""
        import torch

        t, cfg, model = self.t, self.t.config, self.t.model
        ids = self.prompt.token_ids
        device = t.embed.device
        role, previous_start = [], 0
        for i, tok in enumerate(ids):
            if tok == cfg.im_start_token_id:
                previous_start = i
            role.append(ids[min(previous_start + 1, len(ids) - 1)])
        user = [i for i, r in enumerate(role) if r == cfg.user_token_id]
        media = [i for i, tok in enumerate(ids) if tok in t.media_ids]
        rows = {}
        if media:
            hidden = torch.from_numpy(np.ascontiguousarray(self.prompt.media_hidden)).to(
                device, t.embed.dtype
            )
            if hidden.shape[0] != len(media):
                raise ValueError(f"{hidden.shape[0]} media hidden states for {len(media)} placeholders")
            rows = dict(zip(media, model.hidden_projection(hidden), strict=True))
        text = [i for i in user if i not in rows]
        projected = dict(zip(text, model.text_projection(t.embed[torch.tensor([ids[i] for i in text], device=device)]),
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
        a = model.text_projection(t.embed[torch.tensor(opening, device=device)])[None]  # [1, 4, h]
        text_part = torch.cat([a[:, :3], t.tts_pad.expand(4, -1)[None], t.tts_bos[None], a[:, 3:4]], dim=1)
        tc = cfg.talker_config
        codes = torch.tensor([[tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id, self.speaker_id,
                               tc.codec_pad_id, tc.codec_bos_id]], device=device)  # fmt: skip
        codec_part = torch.cat(
            [torch.zeros((1, 3, text_part.shape[-1]), device=device, dtype=text_part.dtype),
             model.get_input_embeddings()(codes)], dim=1)  # fmt: skip
        assistant = text_part + codec_part
        embeds = assistant if user_part is None else torch.cat([user_part, assistant], dim=1)
        talker_ids = [ids[i] for i in user] + [cfg.tts_pad_token_id] * assistant.shape[1]
        return embeds, torch.tensor([talker_ids], device=device)

    def _text(self, step: int, timeout: float | None):
        """The text the talker reads at `step`: generated token step+1 while more follows it,
        `tts_eos` at the end, `tts_pad` after. As the model's generate reads the thinker's output,
        the last generated token (its eos, or the last of a length-capped answer) is not read, so
        step k needs token k+2 (or the end) before it runs."""
        import torch

        tokens, ended = self._generated(step + 3, timeout)
        end = max(len(tokens) - 2, 0) if ended else step + 1
        if step < end:
            with torch.inference_mode():
                ids = torch.tensor([tokens[step + 1]], device=self.t.embed.device)
                return self.t.model.text_projection(self.t.embed[ids])
        return self.t.tts_eos if step == end else self.t.tts_pad

    def _over_budget(self, step: int) -> bool:
        """Past its share of frames for a text that has ended (Sampling.max_frames_per_token)."""
        per_token = self.sampling.max_frames_per_token
        with self._more:
            ended = self._finished or self._end_at is not None
            said = len(self._tokens) if self._end_at is None else self._end_at + 1
            return bool(per_token and ended and step + 1 >= per_token * said + TAIL_FRAMES)

    def frames(self, timeout: float | None = None) -> Iterator[np.ndarray]:
        """[1, 16] codes per frame as generated (callers batch them); `timeout` bounds each wait for
        the thinker's next token. Each step runs in inference mode on its own: a caller may resume
        the generator on another thread (grad mode is per thread)."""
        run = self._begin(timeout)
        while (frame := self._residuals(run)) is not None:
            yield frame
            self._advance(run, timeout)

    @contextlib.contextmanager
    def _step(self) -> Iterator[None]:
        """One model step: alone in the process (_STEP), in inference mode, drawing from the
        stream's own random state when it has one. Waits for the thinker come before, outside."""
        import torch

        with _STEP, torch.inference_mode(), self._rng.active() if self._rng else contextlib.nullcontext():
            yield

    def _begin(self, timeout: float | None) -> _Run:
        """The talker's prefill on the thinker's first token, and its first code."""
        import torch
        from transformers import DynamicCache
        from transformers.generation.logits_process import (
            LogitsProcessorList,
            RepetitionPenaltyLogitsProcessor,
            SuppressTokensLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        t, model, s = self.t, self.t.model, self.sampling
        device = t.embed.device
        processors = LogitsProcessorList()
        if s.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
        processors.append(SuppressTokensLogitsProcessor(t.suppressed, device=device))
        if s.do_sample:
            processors.extend([TemperatureLogitsWarper(s.temperature), TopKLogitsWarper(s.top_k),
                               TopPLogitsWarper(s.top_p)])  # fmt: skip
        tokens, _ = self._generated(1, timeout)
        # an empty text (or one that ends at once: a call's marker first) opens as the eos would
        first = tokens[0] if tokens and self._end_at != 0 else self.t.config.im_end_token_id
        with self._step():
            embeds, talker_ids = self._prefill_embeds(first)
            mask = torch.ones(talker_ids.shape, dtype=torch.long, device=device)
            media = {}
            if self.prompt.image_grid_thw:
                media["image_grid_thw"] = torch.tensor(self.prompt.image_grid_thw, device=device)
            if self.prompt.audio_feature_lengths:
                media["audio_feature_lengths"] = torch.tensor(
                    self.prompt.audio_feature_lengths, device=device
                )
            cache = DynamicCache()
            model.rope_deltas = None
            out = model(inputs_embeds=embeds, attention_mask=mask, talker_input_ids=talker_ids,
                        past_key_values=cache, use_cache=True, output_hidden_states=True, **media)  # fmt: skip
            run = _Run(
                processors,
                cache,
                mask,
                model.rope_deltas,
                out,
                torch.zeros((1, 0), dtype=torch.long, device=device),
            )
            run.code = self._pick(run, out.logits)
        return run

    def _pick(self, run: _Run, logits):
        import torch

        scores = run.processors(run.generated, logits[:, -1].float())
        if self.sampling.do_sample:
            return torch.multinomial(torch.softmax(scores, dim=-1), 1)
        return scores.argmax(-1, keepdim=True)

    def _residuals(self, run: _Run) -> np.ndarray | None:
        """The frame of the code just drawn (the code predictor's 15 residual codes beside it), or
        None when the talker ends here (as generate: the last code drawn gets no residual codes)."""
        import torch

        t, model, s = self.t, self.t.model, self.sampling
        eos = t.config.talker_config.codec_eos_token_id
        with self._step():
            run.generated = torch.cat([run.generated, run.code], dim=1)
            code = int(run.code)
            if code == eos or run.generated.shape[1] == s.max_frames or self._over_budget(run.step):
                self.ended_by = (
                    "codec_eos" if code == eos else "max_frames" if run.generated.shape[1] == s.max_frames
                    else "text_budget"
                )  # fmt: skip
                return None
            last_hidden = model.get_input_embeddings()(run.code)
            past_hidden = run.out.hidden_states[0][-1][:, -1:]
            predictor_kwargs = {"top_k": 50, "top_p": 0.8} if s.do_sample else {}
            predicted = model.code_predictor.generate(
                inputs_embeds=torch.cat((past_hidden, last_hidden), dim=1),
                max_new_tokens=t.codebooks - 1, do_sample=s.do_sample, output_hidden_states=True,
                return_dict_in_generate=True, **predictor_kwargs,
            )  # fmt: skip
            run.codec = torch.cat(
                [last_hidden]
                + [h[0] for h in predicted.hidden_states[1:]]
                + [model.code_predictor.get_input_embeddings()[-1](predicted.sequences[..., -1:])],
                dim=1,
            )
            return torch.cat((run.code, predicted.sequences), dim=-1).cpu().numpy()

    def _advance(self, run: _Run, timeout: float | None) -> None:
        """The talker's next step: the frame's codes and the text it reads now in, the next code out."""
        import torch

        model = self.t.model
        text = self._text(run.step, timeout)
        with self._step():
            step_embeds = run.codec.sum(1, keepdim=True) + text[None]
            run.mask = torch.cat([run.mask, run.mask.new_ones((1, 1))], dim=1)
            model.rope_deltas = run.rope_deltas
            run.out = model(inputs_embeds=step_embeds, attention_mask=run.mask, past_key_values=run.cache,
                            use_cache=True, output_hidden_states=True, generation_step=run.step)  # fmt: skip
            run.code = self._pick(run, run.out.logits)
            run.step += 1


@dataclass
class _Run:
    """One talker generation's state between its steps."""

    processors: object
    cache: object
    mask: object
    rope_deltas: object
    out: object
    generated: object
    code: object = None
    codec: object = None
    step: int = 0


def verify(path: Path, options: o.Qwen3OmniTalker) -> None:
    checkpoint.verify(path, "talker_config")


def prepare(dest: Path, options: o.Qwen3OmniTalker) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniTalker) -> Talker:
    return Talker(path, options)
