"""Every plugin table has one shape (plugins.Registry), and a profile naming an unknown plugin or a
bad parameter fails when it is loaded, with the field's path."""

import subprocess
import sys

import pytest
import yaml
from pydantic import BaseModel

from kv_store import eviction
from services.common.paths import REPO_ROOT
from services.models.profile import CONFIG_DIR, Profile
from services.models.registry import ADAPTERS
from services.policies import urgency
from services.policies.scorers import SCORERS


@pytest.mark.parametrize("registry", [eviction.POLICIES, urgency.POLICIES, SCORERS])
def test_every_policy_declares_typed_params_with_defaults(registry):
    for name in registry.names():
        params = registry.params(name)  # the defaults alone are valid
        assert isinstance(params, BaseModel)
        with pytest.raises(ValueError, match=f"{name!r}: no_such_param"):
            registry.params(name, {"no_such_param": 1})


def test_every_adapter_can_be_built_or_verified():
    for name in ADAPTERS.names():
        module = ADAPTERS.module(name)
        assert hasattr(module, "prepare") or hasattr(module, "verify"), name


def test_every_adapter_declares_typed_options():
    for name in ADAPTERS.names():
        with pytest.raises(ValueError, match=f"{name!r}: .*no_such_option: Extra inputs"):
            ADAPTERS.params(name, {"no_such_option": 1})


def test_profile_options_are_typed_without_importing_the_adapters():
    """Loading a profile validates every model's options into its class; no adapter module (torch,
    onnxruntime) is imported for it (a fresh interpreter: this one has imported them already)."""
    code = (
        "import sys; from services.models.profile import load_profile\n"
        "for name in ('tiny', 'small', 'qwen3-omni'):\n"
        "    for role, spec in load_profile(name).models:\n"
        "        assert spec is None or type(spec.options).__module__ == 'services.models.options', role\n"
        "loaded = [m for m in sys.modules if m.startswith(('torch', 'onnxruntime', 'services.models.tiny', 'services.models.small'))]\n"
        "assert not loaded, loaded\n"
        "tiny = load_profile('tiny').models\n"
        "assert tiny.vision.options.thinker_hidden_size == tiny.thinker.options.hidden_size\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def _tiny() -> dict:
    return yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["kv_store"].update(policy="belady"), "unknown eviction policy 'belady'"),
        (lambda d: d["kv_store"].update(policy="tinylfu", policy_params={"width": 1}), "width"),
        (lambda d: d["realtime"]["scheduler"].update(policy="edf"), "unknown urgency policy 'edf'"),
        (
            lambda d: d["realtime"]["scheduler"].update(params={"safe_ms": 5000, "hold_ms": 10}),
            "safe_ms < hold_ms",
        ),
        (lambda d: d["models"]["thinker"].update(adapter="gpt5"), "unknown model adapter 'gpt5'"),
        (
            lambda d: d["models"]["talker"]["options"].update(units_per_char=0),
            "(?s)models.talker\n.*tiny_talker.: units_per_char: Input should be greater",
        ),
        (lambda d: d["models"]["thinker"]["options"].update(hidden=64), "'tiny_llama': hidden: Extra inputs"),
    ],
)
def test_a_bad_plugin_name_or_parameter_fails_at_profile_load(edit, says):
    data = _tiny()
    data.setdefault("kv_store", {})
    data.setdefault("realtime", {}).setdefault("scheduler", {})
    edit(data)
    with pytest.raises(ValueError, match=says):
        Profile.model_validate(data)
