"""Renders of the chart, once per session."""

from typing import Any

import pytest

from services.deploy import render
from tests.chart.helpers import ALL_ON, VALUES_FILES, values


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Manifests per values set: the shipped values files and every optional part on."""
    return {name: render(values(name)) for name in VALUES_FILES} | {"all-on": render(ALL_ON)}
