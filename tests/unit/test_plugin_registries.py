"""Every plugin table has one shape (plugins.Registry), and a profile naming an unknown plugin or a
bad parameter fails when it is loaded, with the field's path."""

import pytest
import yaml
from pydantic import BaseModel

from kv_store import eviction
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
    ],
)
def test_a_bad_plugin_name_or_parameter_fails_at_profile_load(edit, says):
    data = _tiny()
    data.setdefault("kv_store", {})
    data.setdefault("realtime", {}).setdefault("scheduler", {})
    edit(data)
    with pytest.raises(ValueError, match=says):
        Profile.model_validate(data)
