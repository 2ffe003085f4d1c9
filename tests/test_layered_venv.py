"""scripts/layered_venv.py (used by install_agents_test.sh and install_sglang_cpu.sh): a venv made
from inside a venv sees that venv's packages, its .pth-installed ones too, and its own come first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _purelib(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip())


def test_a_venv_made_from_a_venv_sees_its_packages_and_its_own_come_first(tmp_path):
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(parent)], check=True)
    parent_site = _purelib(parent / "bin" / "python")
    (parent_site / "only_in_parent.py").write_text("VALUE = 'parent'\n")
    (parent_site / "shadowed.py").write_text("VALUE = 'parent'\n")
    src = tmp_path / "src"  # an editable install: a .pth file in the parent's site-packages names it
    src.mkdir()
    (src / "editable_in_parent.py").write_text("VALUE = 'editable'\n")
    (parent_site / "editable.pth").write_text(f"{src}\n")

    child = tmp_path / "child"
    subprocess.run([str(parent / "bin" / "python"), str(REPO / "scripts" / "layered_venv.py"), str(child)], check=True)
    (_purelib(child / "bin" / "python") / "shadowed.py").write_text("VALUE = 'child'\n")
    code = ("import only_in_parent, editable_in_parent, shadowed, attrs; "
            "print(only_in_parent.VALUE, editable_in_parent.VALUE, shadowed.VALUE)")  # fmt: skip
    out = subprocess.run([str(child / "bin" / "python"), "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # attrs: from the base interpreter, as before
    assert out.stdout.split() == ["parent", "editable", "child"]

    plain = tmp_path / "plain"  # what the scripts did before: the parent venv's packages are missing
    subprocess.run([str(parent / "bin" / "python"), "-m", "venv", "--system-site-packages", "--without-pip", str(plain)],
                   check=True)  # fmt: skip
    missing = subprocess.run([str(plain / "bin" / "python"), "-c", "import only_in_parent"], capture_output=True)
    assert missing.returncode != 0
