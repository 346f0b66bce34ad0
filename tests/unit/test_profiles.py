"""Every deploy profile validates, and its generated Serve config passes Serve's own schema."""

import pytest
import yaml

from services.app import DEPLOYMENT_NAMES, serve_config
from services.models.profile import CONFIG_DIR, STAGES, Profile, load_profile
from services.models.registry import ADAPTERS

PROFILES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", PROFILES)
def test_profile_validates_and_renders(name):
    profile = load_profile(name)
    for _, spec in profile.models:
        if spec is not None:
            assert spec.adapter in ADAPTERS.names()
    config = serve_config(name, http_port=8123, grpc_port=9123)
    app = config["applications"][0]
    assert {d["name"] for d in app["deployments"]} == {DEPLOYMENT_NAMES[s] for s in profile.stages}
    assert set(profile.stages) >= set(STAGES) - {"realtime_decode"}  # the one optional stage
    assert config["grpc_options"]["port"] == 9123
    yaml.safe_dump(config)  # what `serve deploy` and the chart consume


def test_stage_overrides_replace_options():
    config = serve_config("tiny", stage_overrides={"encoder": {"max_ongoing_requests": 3}})
    enc = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Encoder")
    assert enc["max_ongoing_requests"] == 3


def test_unknown_profile_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="known"):
        load_profile("does-not-exist")


def test_missing_optional_program_switches_speech_out_off():
    profile = load_profile("small")
    assert profile.models.talker.requires == ["espeak-ng"]
    talker = profile.models.talker.model_copy(update={"requires": ["omniray-no-such-program"]})
    models = profile.models.model_copy(update={"talker": talker})
    why = profile.model_copy(update={"models": models}).speech_out_unavailable()
    assert why and "omniray-no-such-program" in why
    no_speech = profile.model_copy(update={"models": models.model_copy(update={"talker": None})})
    assert "no speech output" in no_speech.speech_out_unavailable()


def test_mounted_checkpoint_is_verified_not_fetched(tmp_path):
    from services.models.build import prepare

    spec = load_profile("qwen3-omni").models.thinker.model_copy(update={"path": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="mount the weights"):
        prepare(spec, tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="expects Qwen3OmniMoeForConditionalGeneration"):
        prepare(spec, tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3OmniMoeForConditionalGeneration"]}')
    assert prepare(spec, tmp_path) is False
    assert not (tmp_path / "omniray_manifest.json").exists()


@pytest.mark.parametrize("name", PROFILES)
def test_openai_names_are_aliases_of_the_model_and_its_voices(name):
    profile = load_profile(name)
    assert profile.serves(profile.served_model_name) and profile.serves("gpt-realtime")
    assert not profile.serves("gpt-17")
    for voice in ("alloy", "ash", "marin", "cedar", *profile.pipeline.voices):
        assert profile.voice(voice) in profile.pipeline.voices
    assert profile.voice("zz") is None


def test_an_alias_must_stand_for_a_voice_of_the_profile():
    raw = yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())
    for bad in ({"alloy": "nobody"}, {"default": "default"}):
        raw["aliases"]["voices"] = bad
        with pytest.raises(ValueError, match="aliases.voices"):
            Profile.model_validate(raw)


def test_a_reply_may_run_a_piece_further_ahead_of_playback():
    """Realtime pacing's piece (services/policies/urgency/liveserve.py): a talker of text pieces
    waits for a piece's end, streamed `stream_interval` tokens at a time; a talker that reads the
    thinker's tokens waits for the next streamed batch only."""
    assert load_profile("tiny").audio_piece_tokens() == 24 + 8 - 1
    assert load_profile("small").audio_piece_tokens() == 24 + 2 - 1
    assert load_profile("qwen3-omni").audio_piece_tokens() == 1
    assert load_profile("qwen3-omni-tiny").audio_piece_tokens() == 1
