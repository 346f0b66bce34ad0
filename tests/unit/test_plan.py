"""Router decisions: request class (total), stage plan, costs, and SLO class capping."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import OmniError
from services.quota.tenants import SLO_CLASSES, TenantSpec
from services.router.plan import DOCUMENT_MIN_IMAGES, plan, slo_class


def _plan(speak=False, items=()):
    """items: ("image", tiles) / ("audio", seconds)."""
    return plan(speak, [n for k, n in items if k == "image"], [s for k, s in items if k == "audio"])


def _image(cols=1, rows=1):
    return ("image", cols * rows)


def _audio(seconds=2.0):
    return ("audio", seconds)


def test_text_only_skips_encoder_and_speech():
    p = _plan()
    assert (p.request_class, p.encode, p.speak, p.tiles) == ("text", False, False, 0)


def test_audio_out_plans_talker_and_vocoder():
    p = _plan(True)
    assert p.speak and p.request_class == "audio"


def test_classes_and_costs():
    assert _plan(False, [_image(2, 3)]).request_class == "image"
    doc = _plan(False, [_image(2, 2)] * 5)
    assert (doc.request_class, doc.tiles, doc.pages) == ("document", 20, 5)
    mixed = _plan(False, [_image(), _audio(3.5)])
    assert (mixed.request_class, mixed.audio_seconds, mixed.encode) == ("audio", 3.5, True)


@given(st.lists(st.sampled_from(["image", "audio"]), max_size=12), st.booleans())
def test_classification_is_total_and_consistent(kinds, speak):
    items = [_image() if k == "image" else _audio() for k in kinds]
    p = _plan(speak, items)
    expected = (
        "audio"
        if "audio" in kinds or speak
        else "document"
        if kinds.count("image") >= DOCUMENT_MIN_IMAGES
        else "image"
        if kinds
        else "text"
    )
    assert p.request_class == expected
    assert p.encode == bool(kinds) and p.speak == speak


@given(st.sampled_from(SLO_CLASSES), st.sampled_from(SLO_CLASSES), st.sampled_from(("", *SLO_CLASSES)))
def test_slo_class_never_above_the_tenant_max(default, max_class, asked):
    tenant = TenantSpec(id="t", default_class=default, max_class=max_class)
    got = slo_class(tenant, asked)
    if asked:
        assert SLO_CLASSES.index(got) >= SLO_CLASSES.index(max_class)
        assert SLO_CLASSES.index(got) >= SLO_CLASSES.index(asked)
    else:
        assert got == default


def test_service_tier_maps_and_unknown_class_is_an_error():
    tenant = TenantSpec(id="t", max_class="realtime")
    assert slo_class(tenant, service_tier="flex") == "batch"
    assert slo_class(tenant, service_tier="priority") == "realtime"
    assert slo_class(tenant, service_tier="auto") == "interactive"
    with pytest.raises(OmniError):
        slo_class(tenant, "urgent")
