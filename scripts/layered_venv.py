"""Create a venv on top of the environment running this script: it sees every package installed here
(editable installs included) and its own packages take precedence.

    python scripts/layered_venv.py VENV_DIR

``python -m venv --system-site-packages`` alone layers on the *base* interpreter: run from inside a
venv, the new one would not see that venv's packages. So where this script runs in a venv, the new
venv also gets a ``.pth`` file that adds this environment's site directories (their own ``.pth``
files processed, as editable installs need) after its own. From a conda env or a plain interpreter
``--system-site-packages`` already covers them.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "_areal_parent_env.pth"


def parent_site_dirs() -> list[str]:
    """This environment's site directories where it is a venv (the base's come with --system-site-packages)."""
    if sys.prefix == sys.base_prefix:
        return []
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def main(venv: str) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
    dirs = parent_site_dirs()
    if dirs:
        python = Path(venv) / "bin" / "python"
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
        (Path(site) / PTH_NAME).write_text(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/layered_venv.py VENV_DIR")
    main(sys.argv[1])
