"""What the engine core receives from omniray: one validated payload (`EnginePayload`), carried in
vLLM's `additional_config["omniray"]`. The profile (services/models/profile.py) validates every value
at load, so a bad setting fails there with its field path, never first inside an engine process; the
engine core parses the same model again (typed access, no defaults of its own: every default lives in
the profile spec that feeds it). Pure pydantic: importing this module imports no vLLM."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

CONFIG_KEY = "omniray"
# A streamed image's multimodal uuid: this + its feature key (services/extensions/vllm/ec_connector.py
# reads the items so named; the thinker engine names them).
EC_ITEM_PREFIX = "omniray-ec:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SinkWindowParams(_Strict):
    """Bounded per-session KV of the decode engine (services/extensions/vllm/sink_window.py): resident
    KV = the first `sink_tokens` + the last `window_tokens`; attention over [0, S) ∪ [t−W, t]."""

    sink_tokens: int = Field(ge=0)
    window_tokens: int = Field(ge=1)


class BlockOrderParams(_Strict):
    """Next-use order of vLLM's free KV blocks (services/extensions/vllm/block_order.py)."""

    soon_s: float = Field(default=5.0, ge=0)  # next use within this: to the tail (evicted last)
    late_s: float = Field(default=30.0, gt=0)  # at least this far: to the head (evicted first)
    default_gap_s: float = Field(default=1.0, ge=0)  # kv_store.follower's next_use
    idle_s: float = Field(default=30.0, gt=0)


class UrgencyPayload(_Strict):
    """The interaction-aware order of running requests (services/extensions/vllm/scheduler.py): an
    urgency policy (services/policies/urgency/) fed by the playback board in Redis."""

    policy: str
    params: dict[str, float]
    board_url: str  # the playback board's Redis
    poll_s: float = Field(gt=0)
    # requests whose class reads their KV or the pool's occupancy (U2) classified anew this often
    refresh_s: float = Field(default=5.0, gt=0)
    # tokens a reply may generate before their audio can come (Profile.audio_piece_tokens)
    piece_tokens: int = Field(default=0, ge=0)
    # the engine's free KV blocks in next-use order from the same board (None: vLLM's LRU)
    block_order: BlockOrderParams | None = None


class EnginePayload(_Strict):
    """The extensions an engine runs (None: off)."""

    urgency: UrgencyPayload | None = None
    sink_window: SinkWindowParams | None = None

    @classmethod
    def of(cls, vllm_config: Any) -> EnginePayload:
        return cls.model_validate((vllm_config.additional_config or {}).get(CONFIG_KEY) or {})

    def additional_config(self) -> dict[str, Any]:
        return {CONFIG_KEY: self.model_dump()}
