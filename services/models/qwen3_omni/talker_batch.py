"""The talker's batched step (a `StepModel` of services/models/stream_loop.py): every stream of the
step advances in one talker forward and one code-predictor pass.

- A stream joins with its prefill, alone (its prompt's length is its own): transformers' talker
  over its user turns and opening, its M-RoPE positions and offset computed for it (kept on the
  stream, never on the module), its keys and values stored in a slot of the KV pool (kv_slots.py),
  its first code drawn.
- The streams already in go on together: each one's frame embeddings and the text it reads now
  in, each at its own position (its length + its M-RoPE offset), attending over its own slot; their
  codes drawn each with its own settings and generator (sampling.py).
- Then every stream of the step whose code does not end it gets its 15 residual codes from the
  code predictor (code_predictor.py), all at once, and its frame.

transformers' modules run as they are (the decoder layers, the heads, the projections): the batch
changes only what they attend over and where positions come from, so a stream alone writes the
frames transformers' generate writes for it (tests/contracts/test_qwen3_omni_talker.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.models.qwen3_omni import sampling
from services.models.qwen3_omni.code_predictor import CodePredictor
from services.models.qwen3_omni.kv_slots import KvSlots
from services.models.stream_loop import End


@dataclass
class _State:
    """A stream's talker state between steps."""

    slot: int
    length: int  # positions in its slot
    rope_delta: int  # its M-RoPE offset: position = length + rope_delta
    generator: object  # its own torch.Generator (a seeded stream), or None (torch's)
    code: int = 0  # the code drawn last
    drawn: int = 0  # codes drawn (transformers' talker_max_new_tokens counts these)
    step: int = 0  # talker steps after the prefill
    hidden: object = None  # [1, h] the talker's last hidden state (the code predictor's first input)
    frame_embeds: object = None  # [1, 16, h] the last frame's codes' embeddings (summed: the next input)


class TalkerBatch:
    def __init__(self, talker, max_streams: int, compile: str | None = None):
        t = talker.config.talker_config.text_config
        p = next(talker.model.parameters())
        self.t = talker
        self.model = talker.model
        self.kv = KvSlots(
            t.num_hidden_layers, t.num_key_value_heads, t.head_dim, max_streams, p.device, p.dtype
        )
        self.history = np.zeros((max_streams, 0), np.int64)  # each slot's codes (repetition penalty)
        self.predictor = CodePredictor(self.model.code_predictor, talker.codebooks, compile)
        self.eos = talker.config.talker_config.codec_eos_token_id
        self.attention = self.model.model.config._attn_implementation

    # ---- StepModel -------------------------------------------------------------------------------

    def step(self, streams: list) -> list:
        import torch

        out: list = [None] * len(streams)
        joining = [i for i, s in enumerate(streams) if s.state is None]
        going = [i for i, s in enumerate(streams) if s.state is not None]
        for i in joining:
            try:
                self._join(streams[i])
            except Exception as e:  # a bad prompt fails its stream alone
                out[i] = e
        if going:
            self._advance([streams[i] for i in going])
        frames = []
        for i, s in enumerate(streams):
            if out[i] is not None:
                continue
            st = s.state
            st.drawn += 1
            self._remember(st)
            if st.code == self.eos:
                out[i] = End("codec_eos")
            elif st.drawn == s.sampling.max_frames:
                out[i] = End("max_frames")
            elif s.over_budget(st.step):
                out[i] = End("text_budget")
            else:
                frames.append(i)
        if frames:
            rows = [streams[i] for i in frames]
            device = self.t.embed.device
            codes = torch.tensor([s.state.code for s in rows], device=device)[:, None]
            code_embeds = self.model.get_input_embeddings()(codes)
            hidden = torch.stack([s.state.hidden for s in rows])
            residual, embeds = self.predictor(
                hidden, code_embeds, [s.sampling.do_sample for s in rows], [s.state.generator for s in rows]
            )
            whole = torch.cat([codes, residual], dim=1)
            for r, i in enumerate(frames):
                streams[i].state.frame_embeds = embeds[r : r + 1]
                out[i] = whole[r : r + 1]
        return out

    def leave(self, stream) -> None:
        self.kv.release(stream.state.slot)

    def output(self, frame) -> np.ndarray:
        return frame.cpu().numpy()

    # ---- the talker -------------------------------------------------------------------------------

    def _join(self, s) -> None:
        """Prefill alone into a slot; the first code drawn."""
        import torch
        from transformers import DynamicCache

        model, prompt = self.model, s.prompt
        device = self.t.embed.device
        embeds, talker_ids = self.t.prefill_embeds(prompt, s.speaker_id, s.first())
        mask = torch.ones(talker_ids.shape, dtype=torch.long, device=device)
        if prompt.image_grid_thw or prompt.video_grid_thw or prompt.audio_feature_lengths:

            def given(values, dtype=None):
                return torch.tensor(values, device=device, dtype=dtype) if values else None

            positions, deltas = model.get_rope_index(
                talker_ids,
                given(prompt.image_grid_thw),
                given(prompt.video_grid_thw),
                mask,
                False,
                given(prompt.audio_feature_lengths),
                given(prompt.video_seconds_per_grid, torch.float32),
            )
            delta = int(deltas[0, 0])
        else:
            positions, delta = (mask.cumsum(-1) - 1)[None].expand(3, -1, -1), 0
        cache = DynamicCache()
        hidden, logits = self._forward(embeds, mask, positions, cache)
        generator = None
        if s.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(s.seed)
        slot = self.kv.claim()
        self.kv.store(slot, cache)
        s.state = _State(slot, embeds.shape[1], delta, generator, hidden=hidden[0, -1:])
        history = torch.zeros((1, 0), dtype=torch.long, device=device)
        s.state.code = int(
            sampling.talker_codes(logits, [s.sampling], history, self.t.suppressed, [generator])[0]
        )

    def _advance(self, streams: list) -> None:
        """One talker forward for streams already in: each one's frame and text in, its next code out."""
        import torch

        states = [s.state for s in streams]
        text = self.t.text_embeds([s.reads(st.step) for s, st in zip(streams, states, strict=True)])
        embeds = torch.cat([st.frame_embeds for st in states]).sum(1, keepdim=True) + text
        lengths = [st.length for st in states]
        device = embeds.device
        positions = torch.tensor([st.length + st.rope_delta for st in states], device=device)
        positions = positions.view(1, -1, 1).expand(3, -1, -1)
        cache = self.kv.step([st.slot for st in states], lengths)
        mask = self.kv.mask(lengths, self.attention, embeds.dtype)
        if mask is None:  # every row at the same length: the plain causal decode, as generate's
            mask = torch.ones((len(states), lengths[0] + 1), dtype=torch.long, device=device)
        hidden, logits = self._forward(embeds, mask, positions, cache)
        drawn = max(st.drawn for st in states)
        history = torch.from_numpy(self.history[[st.slot for st in states], :drawn]).to(device)
        codes = sampling.talker_codes(
            logits, [s.sampling for s in streams], history, self.t.suppressed, [st.generator for st in states]
        ).tolist()
        for r, st in enumerate(states):
            st.length += 1
            st.step += 1
            st.hidden = hidden[r, -1:]
            st.code = codes[r]

    def _forward(self, embeds, mask, positions, cache):
        """transformers' talker over `embeds` at `positions`: its last hidden states, and the codec's
        logits at each row's last position (float32)."""
        hidden = self.model.model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        return hidden, self.model.codec_head(hidden)[:, -1].float()

    def _remember(self, st: _State) -> None:
        """The code just drawn into its slot's history; the rest of the row repeats its first code
        (a repeat changes no repetition penalty), so rows of any length share one array."""
        if st.drawn > self.history.shape[1]:
            width = self.history.shape[1]
            grown = np.zeros((self.history.shape[0], max(2 * width, 64)), np.int64)
            grown[:, :width] = self.history
            if width:
                grown[:, width:] = self.history[:, :1]
            self.history = grown
        if st.drawn == 1:
            self.history[st.slot, :] = st.code
        else:
            self.history[st.slot, st.drawn - 1] = st.code
