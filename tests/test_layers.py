"""The package's layers, kept: the model never imports the service, the client never imports the
server, the server and the gateway stay apart, and no module imports itself back through others.
Every import counts, also those inside functions (a lazy import is still a dependency)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("encoder_server", "encoder_client")


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path, modules):
    """The modules of ours (among `modules`) that the file at `path` imports, by absolute name:
    `from package import module` names the module, not the package it lies in."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules if len(submodules) == len(node.names) else submodules | {base})
    return found & modules


def import_graph():
    modules = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


GRAPH = import_graph()


def reachable(start, graph=GRAPH):
    """Every module that importing `start` may import, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def inside(module, package):
    return module == package or module.startswith(package + ".")


def offenders(layer, forbidden, graph=GRAPH):
    """(module of `layer`, forbidden module it reaches) pairs."""
    return sorted((module, target) for module in graph if inside(module, layer)
                  for target in reachable(module, graph) if any(inside(target, banned) for banned in forbidden))


RULES = {
    # the model is usable without the service: no server, gateway, bulk, settings, nor sockets
    "encoder_server.model": ("encoder_server.server", "encoder_server.gateway", "encoder_server.bulk",
                             "encoder_server.settings", "encoder_server.cli", "encoder_server.processes",
                             "encoder_client.client", "encoder_client.aio", "encoder_client.sockets",
                             "encoder_client.concurrent"),
    "encoder_client": ("encoder_server",),
    "encoder_server.server": ("encoder_server.gateway", "encoder_server.cli", "encoder_server.bulk"),
    "encoder_server.gateway": ("encoder_server.server", "encoder_server.model", "encoder_server.settings",
                               "encoder_server.cli", "encoder_server.bulk"),
}


@pytest.mark.parametrize("layer", RULES)
def test_a_layer_reaches_nothing_it_must_not(layer):
    assert offenders(layer, RULES[layer]) == []


def cycles(graph):
    """Strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter[0]
                    counter[0] += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_no_module_imports_itself_back():
    assert cycles(GRAPH) == []


def test_the_layer_check_catches_a_model_module_that_imports_the_server():
    graph = {**GRAPH, "encoder_server.model.pooling": GRAPH["encoder_server.model.pooling"] |
             {"encoder_server.server.sink"}}
    assert ("encoder_server.model.pooling", "encoder_server.server.sink") in offenders(
        "encoder_server.model", RULES["encoder_server.model"], graph)


def test_the_cycle_check_catches_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
