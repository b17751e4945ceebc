"""The package's layering, read from the source: no import cycle among stabexp's modules, and
the model files import nothing of the probes, the trainer or the data (probes observe the model
through forward hooks; docs/architecture.md)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _imports():
    """module -> the modules under src/ it imports (at the top or inside a function): stabexp's and
    its Hydra plug-ins' (hydra_plugins), so that a cycle through the launcher is seen too."""
    files = {".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): f
             for f in SRC.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("stabexp", "hydra_plugins")):
                found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files}
                found |= {node.module} & files.keys()
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names} & files.keys()
        graph[name] = found - {name}
    return graph


def test_no_import_cycle():
    graph, cycles = _imports(), []
    assert "hydra_plugins.stabexp_launcher.packed_launcher" in graph and "stabexp.cli" in graph

    def visit(path):
        for nxt in graph[path[-1]]:
            if nxt == path[0]:
                cycles.append(" -> ".join(path + [nxt]))
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its smallest module
                visit(path + [nxt])

    for module in graph:
        visit([module])
    assert not cycles, cycles


def test_the_model_files_know_nothing_of_probes_trainer_or_data():
    graph = _imports()
    for module in (m for m in graph if m.startswith("stabexp.model")):
        bad = {m for m in graph[module] if m.startswith(("stabexp.probes", "stabexp.train", "stabexp.data"))}
        assert not bad, f"{module} imports {sorted(bad)}"
        text = (SRC / Path(*module.split("."))).with_suffix(".py")
        text = text if text.exists() else SRC / Path(*module.split(".")) / "__init__.py"
        assert "probe" not in text.read_text().lower(), f"{module} names the probes"


def test_no_module_imports_back_up_the_layers():
    """The probes know nothing of the trainer, the data or the command line (a monitor runs them on
    a model and loop of one's own, stabexp.monitor); the config knows nothing of what it configures
    beyond the registries (stabexp.plugins) and the model's options (stabexp.model_options); the
    trainer, the trackers and the memory estimates nothing of the commands that use them."""
    graph = _imports()
    commands = ("stabexp.cli", "stabexp.app", "stabexp.preflight", "stabexp.listing")
    above = {"stabexp.probes": ("stabexp.train", "stabexp.data", "stabexp.monitor", "stabexp.tracking", *commands),
             "stabexp.config": ("stabexp.train", "stabexp.probes", "stabexp.data", "stabexp.tracking", "stabexp.model",
                                *commands),
             "stabexp.paths": ("stabexp.config", "stabexp.train", *commands),
             "stabexp.compose": ("stabexp.train", "stabexp.data", *commands),
             "stabexp.memory": ("stabexp.distributed", "stabexp.train", *commands),
             "stabexp.tracking": ("stabexp.plotting", *commands),
             "stabexp.train": commands,
             "stabexp.preflight": ("stabexp.cli", "stabexp.app")}
    for module, imported in graph.items():
        for layer, forbidden in above.items():
            if module == layer or module.startswith(layer + "."):
                bad = {m for m in imported if any(m == f or m.startswith(f + ".") for f in forbidden)}
                assert not bad, f"{module} imports {sorted(bad)}"


# --- lists of names kept by hand, each against the registry it names ---------------------------

def test_every_group_has_its_place_in_the_figures_colour_order():
    """plotting.figures.GROUP_ORDER fixes each group's colour: it lists every group of conf/group
    once, and nothing else."""
    from stabexp.paths import conf_dir
    from stabexp.plotting.figures import GROUP_ORDER

    groups = {p.stem for p in (conf_dir() / "group").glob("*.yaml")}
    assert len(GROUP_ORDER) == len(set(GROUP_ORDER)) and set(GROUP_ORDER) == groups, set(GROUP_ORDER) ^ groups


def test_the_layers_columns_are_the_builtin_probes_own():
    """recording.LAYERS_COLUMNS, layers.csv's header, is the row's index (step, stack, layer,
    sublayer) and the columns the built-in probes declare they fill, each once."""
    from stabexp import plugins
    from stabexp.train.recording import LAYERS_COLUMNS

    declared = {c for name in plugins.names("probe") for c in plugins.registry("probe").get(name).layers_columns}
    index = ["step", "stack", "layer", "sublayer"]
    assert LAYERS_COLUMNS[:4] == index and len(LAYERS_COLUMNS) == len(set(LAYERS_COLUMNS))
    assert set(LAYERS_COLUMNS[4:]) == declared, set(LAYERS_COLUMNS[4:]) ^ declared


def test_the_longest_test_files_named_for_the_workers_exist():
    """conftest.LONGEST_FIRST, the order `make test` hands the longest files to its workers, names
    test files that exist (a renamed one would silently fall back to the end of the queue)."""
    from conftest import LONGEST_FIRST

    tests = {p.stem for p in Path(__file__).parent.glob("test_*.py")}
    assert set(LONGEST_FIRST) <= tests, set(LONGEST_FIRST) - tests


def test_every_module_is_on_the_architecture_page():
    """docs/architecture.md's map of the package (its lines "  path  what it holds") names every
    module, or a folder holding it, so that a new module is placed where a reader looks for it."""
    import re

    page = (SRC.parent / "docs" / "architecture.md").read_text()
    entries = set(re.findall(r"^  ([\w/]+(?:\.py|/))(?:\s|$)", page, flags=re.M))
    package = SRC / "stabexp"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        folders = {p.as_posix() + "/" for p in rel.parents if p.as_posix() != "."}
        if rel.as_posix() in ("__init__.py", "__main__.py") or rel.as_posix() in entries or folders & entries:
            continue
        body = ast.parse(path.read_text()).body
        if rel.name == "__init__.py" and all(isinstance(n, ast.Expr) for n in body):  # a docstring alone
            continue
        missing.append(rel.as_posix())
    assert not missing, missing


def test_every_package_is_in_what_the_install_ships():
    """pyproject.toml lists the packages a (non-editable) install ships: every folder of src/
    holding an __init__.py is among them, or `pip install .` leaves it out."""
    import tomllib

    shipped = set(tomllib.loads((SRC.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(SRC).parts) for p in SRC.rglob("__init__.py")}
    assert found <= shipped, found - shipped
