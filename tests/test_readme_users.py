"""The README lists every Locust user class and every setting the users read (issue:
"the README lists every Locust user class and its settings"), so a user added to a
protocol folder without documentation fails here."""

import re
from pathlib import Path

import pytest

from proxy import protocols
from tests._support.processes import ROOT

README = (ROOT / "README.md").read_text()
SPECS = [s for s in protocols.specs() if s.users]


def _section():
    start = README.index("## Locust users and their settings")
    end = README.index("\n## ", start + 1)
    return README[start:end]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_user_class_and_setting_is_in_the_readme(spec):
    section = _section()
    assert f'**{spec.name}** (`request_type="{spec.name}"`)' in section
    for name in spec.user_classes:
        assert f"- `{name}`: " in section, name
    source = Path(ROOT, *spec.users.split(".")).with_suffix(".py").read_text()
    variables = set(re.findall(r"FRAMETAP_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])", source))
    assert variables, f"{spec.users} reads no FRAMETAP_* setting?"
    for var in sorted(variables):
        assert f"`{var}`" in section, f"{var} (read by {spec.users}) is not in the README"
