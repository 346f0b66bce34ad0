"""Ephemeral client secrets against a real Redis: single use (also when two gateways race for one),
expiry, tenant (as it is when redeemed) and settings carried, only a digest stored, a tenant's cap
of outstanding secrets."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from services.common.errors import OmniError
from services.quota.buckets import Buckets
from services.quota.client_secrets import PREFIX, REDIS_OUTSTANDING, REDIS_SECRET, AtCap, ClientSecrets
from services.quota.service import QuotaService
from services.quota.tenants import Limits, RealtimeLimits, Tenants, TenantSpec, key_digest


@pytest.fixture
async def redis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


TENANT = TenantSpec(id="acme", per_minute=Limits(text_tokens=5000))


async def test_a_secret_opens_one_session_with_its_tenant_and_settings(redis):
    secrets = ClientSecrets(redis)
    value, expires_at = await secrets.mint(TENANT, {"instructions": "be brief"}, 60)
    assert value.startswith(PREFIX) and len(value) > 40
    assert abs(expires_at - (time.time() + 60)) < 2
    key = REDIS_SECRET.format(key_digest(value))  # the digest, not the secret
    assert value.encode() not in await redis.get(key)
    redeemed = await secrets.redeem(value)
    assert redeemed.tenant_id == "acme" and redeemed.session == {"instructions": "be brief"}
    assert await secrets.redeem(value) is None  # single use
    assert not await redis.exists(key)


async def test_two_gateways_racing_for_one_secret_get_it_once(redis):
    value, _ = await ClientSecrets(redis).mint(TENANT, {}, 60)
    results = await asyncio.gather(*(ClientSecrets(redis).redeem(value) for _ in range(8)))
    assert sum(r is not None for r in results) == 1


async def test_an_expired_secret_is_refused(redis):
    secrets = ClientSecrets(redis)
    value, _ = await secrets.mint(TENANT, {}, 1)
    await asyncio.sleep(1.2)
    assert await secrets.redeem(value) is None


async def test_the_quota_service_refuses_unknown_used_and_expired_secrets_with_a_401(redis, tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n- id: acme\n")
    service = QuotaService(Tenants(path, redis, reload_s=0.0), Buckets(redis))
    value, _ = await service.mint_secret(TENANT, {"instructions": "hi"}, 60)
    tenant, session = await service.redeem_secret(value)
    assert tenant.id == "acme" and session == {"instructions": "hi"}
    for bad in (value, PREFIX + "never-minted"):
        with pytest.raises(OmniError) as refused:
            await service.redeem_secret(bad)
        assert refused.value.status == 401 and refused.value.code == "invalid_client_secret"
    # a secret is not an API key: REST does not take it
    fresh, _ = await service.mint_secret(TENANT, {}, 60)
    with pytest.raises(OmniError) as refused:
        await service.authenticate(fresh)
    assert refused.value.status == 401
    # its tenant is looked up when it is used: a tenant removed since opens nothing
    path.write_text("tenants: []\n")
    with pytest.raises(OmniError) as refused:
        await service.redeem_secret(fresh)
    assert refused.value.status == 401 and refused.value.code == "invalid_client_secret"


async def test_a_tenant_holds_at_most_its_cap_of_outstanding_secrets(redis, tmp_path):
    """Minted and neither used nor expired count against the cap; using or outliving one frees its
    place; a refusal is a 429 that says when the next one may be minted, and stores nothing."""
    capped = TenantSpec(id="capped", realtime=RealtimeLimits(max_client_secrets=2))
    secrets = ClientSecrets(redis)
    first, _ = await secrets.mint(capped, {}, 60)
    await secrets.mint(capped, {}, 1)
    stored = len(await redis.keys(REDIS_SECRET.format("*")))
    with pytest.raises(AtCap) as at_cap:
        await secrets.mint(capped, {}, 60)
    assert at_cap.value.outstanding == 2 and 0 < at_cap.value.free_at - time.time() <= 1.5
    assert len(await redis.keys(REDIS_SECRET.format("*"))) == stored
    await asyncio.sleep(1.2)  # the short one expired: its place is free
    await secrets.mint(capped, {}, 60)
    with pytest.raises(AtCap):
        await secrets.mint(capped, {}, 60)
    assert await secrets.redeem(first) is not None  # used: its place is free
    third, _ = await secrets.mint(capped, {}, 60)
    assert await redis.zcard(REDIS_OUTSTANDING + "capped") == 2
    assert TenantSpec(id="default").realtime.max_client_secrets == 1000  # bounded unless a tenant says not

    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n- id: capped\n")
    service = QuotaService(Tenants(path, redis, reload_s=0.0), Buckets(redis))
    with pytest.raises(OmniError) as refused:
        await service.mint_secret(capped, {}, 60)
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    assert 1 <= int(refused.value.headers["retry-after"]) <= 60
    uncapped = TenantSpec(id="uncapped", realtime=RealtimeLimits(max_client_secrets=None))
    for _ in range(5):
        await service.mint_secret(uncapped, {}, 60)
