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
