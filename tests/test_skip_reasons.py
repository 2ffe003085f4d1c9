"""Every skip tells a newcomer why (``pytest -rs``): ``importorskip`` calls carry a ``reason`` (its
default, "could not import 'x'", names no install command), and skips and skipifs a message."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_FILES = sorted(
    p for pattern in ("tests/*.py", "plugins/*/tests/*.py", "examples/*/tests/*.py") for p in REPO.glob(pattern)
)


def _pytest_calls(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    return [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
        and isinstance(node.func.value, (ast.Name, ast.Attribute))
        and (getattr(node.func.value, "id", None) == "pytest" or getattr(node.func.value, "attr", None) == "mark")
    ]  # fmt: skip


def test_every_skip_says_why():
    missing = []
    for path in TEST_FILES:
        tree = ast.parse(path.read_text(), str(path))
        for call in _pytest_calls(tree, {"importorskip", "skipif"}):
            if not any(k.arg == "reason" for k in call.keywords):
                missing.append(f"{path.relative_to(REPO)}:{call.lineno} {call.func.attr} without reason=")
        for call in _pytest_calls(tree, {"skip"}):
            if not call.args and not any(k.arg == "reason" for k in call.keywords):
                missing.append(f"{path.relative_to(REPO)}:{call.lineno} skip without a message")
    assert len(TEST_FILES) > 50 and not missing, "\n".join(missing)
