"""Plug-ins: residual placements, init rules, tasks, optimisers and probes from a user's own
module, with no edit of stabexp (docs/plugins.md).

A config value names one of each kind (group.residual and the per-stack residuals, group.init,
task.kind, optim.name, each of probe.extra) in one of two ways:

- a registered name, one that an entry point of the kind's group registers (stabexp.placements,
  stabexp.inits, stabexp.tasks, stabexp.optimizers, stabexp.probes). An entry point's object is
  either a mapping name -> plug-in (a package offering several) or one plug-in, named by the
  entry point's name. The package's own built-ins are registered the same way (pyproject.toml),
  so there is one mechanism: their names come first, and a name registered twice is the first
  package's (stabexp, then the others by distribution name);
- else a dotted path `module.attr` (Hydra's `_target_` form), the module importable from
  sys.path (PYTHONPATH, or an installed package).

Each kind has one Registry. It loads its group's entry points once, on first use; resolves a
name; accepts the object as the kind says (a Residual subclass becomes a Placement, ...); checks a
plug-in from outside the package once (a tiny model built with a placement runs its forward);
and caches the plug-in, or the refusal. Every lookup of a config value goes through here (the
model, the task table, the optimiser table and `config.validate`), so a plug-in is checked as a
built-in is, when the config is validated, and refused with the same one-line error.

What each kind accepts is decided beside the kind (model/placements.py, model/init.py, data/,
train/optim.py) and named here by reference, as an entry point names its object: those modules
look their plug-ins up through this one, so importing them here would be an import cycle.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Dict, List, Optional, Tuple

from stabexp.errors import ConfigError

PACKAGE = "stabexp"  # the distribution whose entry points are the built-ins


class PluginError(ConfigError):
    """A config value that names no plug-in of its kind, or names an object that is not one:
    one line, exit code 2, as every ConfigError."""


class Rejected(Exception):
    """Raised by a kind's checks: the object is not a plug-in of that kind. The message says why;
    it follows "<key>=<value> is not allowed: " in the error line."""


def one_line(err: BaseException) -> str:
    """An exception as `Type: message` on one line (a user's message may span several)."""
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


def what_is(obj: Any) -> str:
    """A few words for an object that is the wrong kind: 'a function', 'the class Foo', ..."""
    if inspect.isclass(obj):
        return f"the class {obj.__qualname__}"
    if inspect.ismodule(obj):
        return "a module"
    if inspect.isroutine(obj):
        return "a function"
    return f"a {type(obj).__name__}"


def takes(obj: Callable, *arguments: str) -> bool:
    """Whether `obj` can be called with len(arguments) positional arguments (a callable whose
    signature Python cannot read counts as yes)."""
    try:
        inspect.signature(obj).bind(*arguments)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def _load(reference: str) -> Any:
    """The object `module:attr` names, as an entry point's value names it."""
    return EntryPoint(name="", value=reference, group="").load()


def _distribution(ep: EntryPoint) -> Tuple[str, str]:
    dist = getattr(ep, "dist", None)
    return (dist.name, dist.version) if dist is not None else ("?", "")


@dataclass(frozen=True)
class Registered:
    """One plug-in an entry point registers, before it is accepted."""

    obj: Any
    distribution: str  # the package that registers it (stabexp for the built-ins)


class Registry:
    """The plug-ins of one kind: registered names and dotted paths, resolved once each."""

    def __init__(self, kind: str, group: str, key: str, builtins: str, what: str, form: str,
                 accept: str, verify: Optional[str] = None, own_by_name: bool = True):
        self.kind = kind          # "placement": for messages
        self.group = group        # the entry-point group
        self.key = key            # the config key that usually names one (for errors outside validate)
        self.builtins = builtins  # the package's own entry point, loaded directly when its metadata is
                                  # missing (a source tree on PYTHONPATH, not installed)
        self.what = what          # what a dotted path must lead to
        self.form = form          # "module.Class"
        self.accept_ref = accept  # `module:function`: obj -> the plug-in, or Rejected
        self.verify_ref = verify  # `module:function`: name -> None, or Rejected (plug-ins from outside)
        self.own_by_name = own_by_name  # whether the key takes the package's own names (not probe.extra's)
        self.clear()

    def clear(self) -> None:
        """Forget every entry point and resolved name (tests that install a package)."""
        self._table: Optional[Dict[str, Registered]] = None
        self.broken: List[Tuple[str, str, str]] = []  # (entry point, distribution, error)
        self._resolved: Dict[str, Any] = {}

    # --- the entry points ----------------------------------------------------------------

    def entry_points(self) -> List[EntryPoint]:
        """The group's entry points, the package's own first, then by distribution and name."""
        eps = list(entry_points(group=self.group))
        return sorted(eps, key=lambda ep: (_distribution(ep)[0] != PACKAGE, _distribution(ep)[0], ep.name))

    def table(self) -> Dict[str, Registered]:
        if self._table is None:
            table: Dict[str, Registered] = {}
            eps = self.entry_points()
            if not any(_distribution(ep)[0] == PACKAGE for ep in eps):
                eps.insert(0, EntryPoint(name=PACKAGE, value=self.builtins, group=self.group))
            for ep in eps:
                dist = _distribution(ep)[0] if getattr(ep, "dist", None) is not None else PACKAGE
                try:
                    obj = ep.load()
                except Exception as err:  # one broken package must not stop every run
                    self.broken.append((ep.name, dist, one_line(err)))
                    continue
                for name, plugin in (obj.items() if isinstance(obj, Mapping) else [(ep.name, obj)]):
                    table.setdefault(name, Registered(plugin, dist))
            self._table = table
        return self._table

    def names(self) -> List[str]:
        return list(self.table())

    def allowed(self) -> str:
        names = [n for n, r in self.table().items() if self.own_by_name or r.distribution != PACKAGE]
        if not names:
            return f"no package registers a {self.kind} of that name: a dotted path {self.form} to {self.what}"
        return f"one of {', '.join(names)}, or a dotted path {self.form} to {self.what}"

    # --- resolving a name ----------------------------------------------------------------

    def get(self, name: str, key: Optional[str] = None) -> Any:
        """The plug-in `name` names, accepted and (from outside the package) checked; a
        PluginError naming `key` (default: the kind's usual key) otherwise."""
        found = self._resolved.get(name)
        if found is None:
            found = self._resolve(name)
        if isinstance(found, Rejected):
            raise PluginError(f"{key or self.key}={name} is not allowed: {found}")
        return found

    def _resolve(self, name: str) -> Any:
        registered = self.table().get(name)
        try:
            if registered is not None:
                obj, outside = registered.obj, registered.distribution != PACKAGE
            else:
                obj, outside = self._import(name), True
            plugin = _load(self.accept_ref)(obj)
            # Cached before the check, which builds things that look the name up again.
            self._resolved[name] = plugin
            if outside and self.verify_ref is not None:
                _load(self.verify_ref)(name)
        except Rejected as err:
            self._resolved[name] = err
            return err
        return plugin

    def _import(self, path: str) -> Any:
        """The object a dotted path `module.attr` names."""
        module_name, _, attr = path.rpartition(".")
        if not module_name or not attr:
            raise Rejected(self.allowed())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            missing = err.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                raise Rejected(f"no module named {missing} ({self.allowed()})") from None
            raise Rejected(f"importing {module_name} raised {one_line(err)}") from None
        except Exception as err:  # an error inside the user's module
            raise Rejected(f"importing {module_name} raised {one_line(err)}") from None
        if not hasattr(module, attr):
            raise Rejected(f"{module_name} has no attribute {attr} ({self.allowed()})")
        return getattr(module, attr)


# One registry per kind. `accept` turns what a name leads to into the plug-in the package uses
# (or refuses it); `verify` checks a plug-in of another package once, on a tiny model.
_REGISTRIES: Dict[str, Registry] = {
    "placement": Registry(
        "placement", "stabexp.placements", "group.residual", "stabexp.model.placements:PLACEMENTS",
        "a Residual subclass or Placement", "module.Class",
        accept="stabexp.model.placements:as_placement", verify="stabexp.model:check_placement"),
    "init": Registry(
        "init rule", "stabexp.inits", "group.init", "stabexp.model.init:INIT_RULES",
        "a function (model, batch) -> dict of the constants it resolved", "module.function",
        accept="stabexp.model.init:as_init_rule"),
    "task": Registry(
        "task", "stabexp.tasks", "task.kind", "stabexp.data:TASKS",
        "a Task subclass or a factory (cfg, device) -> Task, with `archs`", "module.Class",
        accept="stabexp.data:as_task_factory"),
    "optimiser": Registry(
        "optimiser", "stabexp.optimizers", "optim.name", "stabexp.train.optim:OPTIMISERS",
        "a factory (model, cfg, device) -> torch.optim.Optimizer", "module.function",
        accept="stabexp.train.optim:as_optimiser_factory"),
    "probe": Registry(
        "probe", "stabexp.probes", "probe.extra", "stabexp.probes.builtin:PROBES",
        "a subclass of stabexp.probes.base.Probe", "module.Class",
        accept="stabexp.probes.base:as_probe", own_by_name=False),  # the built-ins: by their probe.<flag>
    "step_hook": Registry(
        "step hook", "stabexp.step_hooks", "train.hooks", "stabexp.train.builtin_hooks:STEP_HOOKS",
        "a subclass of stabexp.train.hooks.StepHook", "module.Class",
        accept="stabexp.train.hooks:as_step_hook", own_by_name=False),  # the built-ins: by their own keys
}
KINDS = tuple(_REGISTRIES)


def registry(kind: str) -> Registry:
    return _REGISTRIES[kind]


def placement(name: str, key: Optional[str] = None):
    """The Placement (model/placements.py) that a placement name or dotted path names."""
    return _REGISTRIES["placement"].get(name, key)


def init_rule(name: str, key: Optional[str] = None) -> Callable:
    """The init rule (model, batch) -> constants that a name or dotted path names."""
    return _REGISTRIES["init"].get(name, key)


def task_factory(kind: str, key: Optional[str] = None) -> Callable:
    """The task factory (cfg, device) -> Task of a task kind or dotted path; its `archs` are the
    model.arch values it trains."""
    return _REGISTRIES["task"].get(kind, key)


def optimiser_factory(name: str, key: Optional[str] = None) -> Callable:
    """The optimiser factory (model, cfg, device) -> torch.optim.Optimizer of a name or dotted path."""
    return _REGISTRIES["optimiser"].get(name, key)


def _own_then_named(kind: str, cfg, names, key: str, builtin_named) -> List[type]:
    """The package's own classes of `kind` that `enabled(cfg)`, then each of `names` (the config
    list `key`), as listed: each a subclass carrying the name it was given; a built-in named there
    (`builtin_named(cls)`: the line why it is not allowed, else None) or a name listed twice refused."""
    reg = _REGISTRIES[kind]
    found = [reg.get(name) for name, r in reg.table().items() if r.distribution == PACKAGE]
    found = [cls for cls in found if cls.enabled(cfg)]
    for name in names:
        cls = reg.get(name, key)
        why = builtin_named(cls, reg.table().get(name))
        if why:
            raise PluginError(f"{key}={name} is not allowed: {why}")
        if sum(n == name for n in names) > 1:
            raise PluginError(f"{key}={name} is not allowed: listed twice")
        found.append(type(cls.__name__, (cls,), {"name": name, "__module__": cls.__module__}))
    return found


def probes(cfg) -> List[type]:
    """The probe classes a config turns on, in the order a run calls them: the package's own
    whose flag is set (probe.<flag>), then each of probe.extra, named as listed."""
    return _own_then_named("probe", cfg, list(cfg.probe.extra), "probe.extra", lambda probe, _: (
        f"a built-in, turned on by probe.{probe.flag}=true" if probe.flag is not None else None))


def step_hooks(cfg) -> List[type]:
    """The step hook classes a config turns on, in the order a run calls them at each moment: the
    package's own that are `enabled(cfg)`, then each of train.hooks, named as listed."""
    return _own_then_named("step_hook", cfg, list(cfg.train.get("hooks", ()) or ()), "train.hooks", lambda _, r: (
        "a built-in, on where its own key turns it on" if r is not None and r.distribution == PACKAGE else None))


def check(kind: str, value: str, key: str) -> Any:
    """`value` of config key `key` resolved as a plug-in of `kind`, or a PluginError naming both."""
    return _REGISTRIES[kind].get(value, key)


def names(kind: str) -> List[str]:
    """The registered names of `kind` (for messages), the package's own first."""
    return _REGISTRIES[kind].names()


def registered(kind: str) -> Dict[str, Any]:
    """Registered name -> object as its entry point gives it, not yet accepted or checked."""
    return {name: r.obj for name, r in _REGISTRIES[kind].table().items()}


def is_dotted_path(value: Optional[str]) -> bool:
    """Whether a config value reads as a dotted path rather than a registered name (the names a
    package registers are plain words)."""
    return isinstance(value, str) and "." in value


@dataclass(frozen=True)
class EntryPointInfo:
    kind: str
    name: str
    value: str          # module:attr
    distribution: str   # name and version


def plugins() -> List[EntryPointInfo]:
    """The entry points of other packages, per kind, without loading them (`stabexp list`)."""
    found = []
    for kind, reg in _REGISTRIES.items():
        for ep in reg.entry_points():
            dist, version = _distribution(ep)
            if dist != PACKAGE:
                found.append(EntryPointInfo(kind, ep.name, ep.value, f"{dist} {version}".strip()))
    return found


def clear() -> None:
    """Forget every registry's entry points and resolved names."""
    for reg in _REGISTRIES.values():
        reg.clear()


__all__ = ["PluginError", "Rejected", "Registry", "placement", "init_rule", "task_factory", "optimiser_factory",
           "check", "probes", "step_hooks", "names", "registered", "plugins", "clear", "is_dotted_path", "what_is", "takes", "KINDS"]
