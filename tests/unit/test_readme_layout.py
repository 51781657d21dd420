"""The README's Layout section names every module of the package (DESIGN §1's layout lives
there): a module added without a line saying what it is fails here."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_is_in_the_readme_layout():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Layout")
    layout = readme[start:readme.index("\n## ", start + 1)]
    missing = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fluxpg").rglob("*.py")
                     if p.name != "__init__.py" and p.name not in layout)
    assert not missing, f"README ## Layout does not name: {', '.join(missing)}"
