"""Rooms a newcomer can find (docs/architecture.md, "Where a change goes"): no module of services/
over 500 lines, no function over 80 outside data tables — a file or function past them is a sign
that two jobs share one place."""

from __future__ import annotations

import ast

from services.common.paths import REPO_ROOT

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# Functions that are data: one declaration per row, nothing to split.
DATA_TABLES = {("services/common/metric_catalog.py", "_declared")}


def _modules():
    return sorted((REPO_ROOT / "services").rglob("*.py"))


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(REPO_ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, long


def test_no_function_is_over_80_lines_outside_data_tables():
    long = {}
    for path in _modules():
        name = str(path.relative_to(REPO_ROOT))
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if (
                not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                or (name, node.name) in DATA_TABLES
            ):
                continue
            if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                long[f"{name}:{node.name}"] = lines
    assert not long, long
