"""The admin guide documents every configuration option, and the README's commands are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jupyter_gpushare.broker import GpuShareBroker
from jupyter_gpushare.config.settings import GpuShareApp
from jupyter_gpushare.launch.provisioner import GpuShareProvisioner

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("cls", [GpuShareApp, GpuShareProvisioner, GpuShareBroker])
def test_every_option_is_in_the_admin_guide_with_its_default(cls):
    guide = (ROOT / "docs" / "admin-guide.md").read_text()
    missing = []
    for name, trait in cls.class_traits(config=True).items():
        if trait.this_class is not cls:
            continue
        row = next((line for line in guide.splitlines() if line.startswith(f"| `{cls.__name__}.{name}`")), None)
        if row is None:
            missing.append(f"{cls.__name__}.{name} (no table row)")
        elif not trait.help or len(trait.help) < 40:
            missing.append(f"{cls.__name__}.{name} (help= too short to state units and default)")
    assert not missing, f"document these in docs/admin-guide.md's Configuration table: {missing}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert len(blocks) >= 2, "README must show the run and the test command"
    assert "README.md" in ci and "test-command" in ci and "<!-- test-command -->" in readme
