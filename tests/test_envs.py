"""Every environment variable the plugin reads is read in ``specdec_plugin/envs.py`` and listed in
the README's configuration table: a variable read elsewhere, or missing from either, fails here."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec_plugin"
NAME = re.compile(r"SPECDEC_[A-Z0-9_]+")
# A read of the environment: os.environ.get / [] / getenv with a SPECDEC_ literal.
READ = re.compile(r"(os\.environ(\.get)?[\[(]|os\.getenv\()\s*[\"'](SPECDEC_[A-Z0-9_]+)")


def _readme_table() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return {m.group(0) for line in section.splitlines() if line.startswith("| `")
            for m in NAME.finditer(line.split("|")[1])}


def test_environment_is_read_only_in_envs():
    outside = {
        f"{path.relative_to(ROOT)}: {m.group(3)}"
        for path in PACKAGE.rglob("*.py") if path.name != "envs.py"
        for m in READ.finditer(path.read_text())
    }
    assert not outside, f"read these through specdec_plugin/envs.py: {sorted(outside)}"


def test_envs_and_readme_list_the_same_variables():
    envs_text = (PACKAGE / "envs.py").read_text()
    read_in_envs = {m.group(3) for m in READ.finditer(envs_text)}
    documented_in_envs = set(NAME.findall(envs_text.split('"""', 2)[1]))
    assert read_in_envs, "envs.py reads nothing?"
    assert read_in_envs == documented_in_envs, "envs.py's docstring and its reads differ"
    assert read_in_envs == _readme_table(), "README's configuration table and envs.py differ"
