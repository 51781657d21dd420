"""The import graph keeps its layers (issue 14, DESIGN §1): errors/delivery at the bottom; db,
config and topics never reach up into the queue manager; the protocol front-ends (and the HTTP
console) reach the database only through the queue manager — no `fluxpg.db` import, no
`manager.pool`. Read from the source with ast, so imports inside functions count too."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fluxpg"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every fluxpg module `path` imports (absolute names; `from fluxpg import db` → fluxpg.db)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {name for name in found if name == "fluxpg" or name.startswith("fluxpg.")}


def pool_uses(path: Path) -> list[int]:
    """Lines that read `<something>.manager.pool` / `manager.pool` / `mgr.pool`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and node.args[1].value == "pool"):
            node = ast.Attribute(value=node.args[0], attr="pool", lineno=node.lineno)   # getattr(manager, "pool")
        if isinstance(node, ast.Attribute) and node.attr == "pool":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("manager", "mgr", "qm"):
                lines.append(node.lineno)
    return lines


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_the_bottom_modules_import_nothing_above_them():
    assert imports(MODULES["fluxpg.errors"]) == set()
    assert imports(MODULES["fluxpg.delivery"]) <= {"fluxpg.errors", "fluxpg.errors.InvalidArgument"}


def test_db_config_and_topics_do_not_import_the_queue_manager():
    for name in ("fluxpg.db", "fluxpg.config", "fluxpg.topics"):
        wrong = sorted(i for i in imports(MODULES[name]) if i.startswith("fluxpg.queues"))
        assert not wrong, f"{name} imports {wrong}"


# The authenticator is a front-end's helper: fluxpg.users is read through the queue manager too.
FRONT_ENDS = [name for name in MODULES
              if name.startswith(("fluxpg.protocols", "fluxpg.console")) or name == "fluxpg.auth_config"]


def test_front_ends_reach_the_database_only_through_the_queue_manager():
    assert FRONT_ENDS
    problems = []
    for name in sorted(FRONT_ENDS):
        path = MODULES[name]
        for imported in sorted(imports(path)):
            if imported == "fluxpg.db" or imported.startswith("fluxpg.db."):
                problems.append(f"{name} imports {imported}")
        problems += [f"{name}:{line} uses manager.pool" for line in pool_uses(path)]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_what_it_must(tmp_path):
    """The checker itself: a relative import, an import inside a function and manager.pool."""
    pkg = PACKAGE / "protocols"
    probe = pkg / "_import_graph_probe.py"
    try:
        probe.write_text("def f(self):\n    from .. import db\n    return self.manager.pool, getattr(self.manager, 'pool')\n")
        assert "fluxpg.db" in imports(probe) and pool_uses(probe) == [3, 3]
    finally:
        probe.unlink()
