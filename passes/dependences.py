"""Dependence analysis over storages: the reads and writes through views of each tensor that exporters update
in place (slice-assignment becomes ScatterND / ScatterElements).

A *storage* is a chain of tensor versions `v0 -> v1 -> ...` where each `v(k+1)` is a write (scatter) into `vk`.
Reads are the other consumers of a version (usually views: Slice, Gather, Reshape, ...). In program order:
- RAW: the write that made `vk` -> every read of `vk`;
- WAR: every read of `v(k-1)` -> the write that makes `vk` (an in-place update must wait for them);
- WAW: the write that made `v(k-1)` -> the write that makes `vk`.

Fusion keeps every edge by construction: a fused write is a guarded select over the older version, so a read
inside the group sees exactly the version it names, and a read outside it makes the group materialise that
version. The planner uses the chains to report the full-tensor copies that fusion removes (onnxruntime copies
the whole data tensor for every scatter node). Precondition: a toposorted graph and its analysis. The graph is not
modified.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from evonnx.passes.analyze import Analysis
from evonnx.passes.lower_ops import SHAPE_ONLY_OPS, WRITE_OPS


@dataclass(frozen=True)
class Access:
    node: str
    op: str
    kind: str  # "read" or "write"
    version: int  # the version read, or the version a write creates
    view: str  # the view the access goes through, when known


@dataclass(frozen=True)
class DepEdge:
    kind: str  # "RAW", "WAR" or "WAW"
    src: str  # node names
    dst: str
    storage: str


@dataclass(frozen=True)
class Storage:
    name: str  # the tensor of version 0
    versions: tuple[str, ...]
    accesses: tuple[Access, ...]


@dataclass(frozen=True)
class DepInfo:
    storages: tuple[Storage, ...]
    edges: tuple[DepEdge, ...]

    def describe(self) -> str:
        if not self.storages:
            return "no writes through views"
        lines = []
        for s in self.storages:
            lines.append(f"storage {s.name}: versions {' -> '.join(s.versions)}")
            for a in s.accesses:
                lines.append(f"  v{a.version} {a.kind:5} {a.node} ({a.op}){' via ' + a.view if a.view else ''}")
            for e in self.edges:
                if e.storage == s.name:
                    lines.append(f"  {e.kind}: {e.src} -> {e.dst}")
        return "\n".join(lines)


def _view_of(an: Analysis, node: gs.Node) -> str:
    lowered = an.lowered.get(node.name)
    if isinstance(lowered, list) and lowered and lowered[0].view is not None and lowered[0].view[0] == 0:
        return str(lowered[0].view[1])
    return ""


def analyze_dependences(g: gs.Graph, an: Analysis) -> DepInfo:
    writes = {n.outputs[0].name: n for n in g.nodes if n.op in WRITE_OPS and n.outputs}
    consumers: dict[str, list[gs.Node]] = {}
    for n in g.nodes:
        for t in n.inputs:
            if t.name:
                consumers.setdefault(t.name, []).append(n)
    storages: list[Storage] = []
    edges: list[DepEdge] = []
    for n in g.nodes:
        if n.op not in WRITE_OPS or n.inputs[0].name in writes:
            continue  # not the first write of a chain
        versions = [n.inputs[0].name]
        accesses: list[Access] = []
        write_nodes: list[gs.Node] = []
        w: gs.Node | None = n
        while w is not None:
            write_nodes.append(w)
            versions.append(w.outputs[0].name)
            nxt = [c for c in consumers.get(w.outputs[0].name, []) if c.op in WRITE_OPS and c.inputs[0] is w.outputs[0]]
            w = nxt[0] if nxt else None
        name = versions[0]
        for k, v in enumerate(versions):
            if k > 0:
                accesses.append(Access(write_nodes[k - 1].name, write_nodes[k - 1].op, "write", k, ""))
            readers = [c for c in consumers.get(v, []) if not (c.op in WRITE_OPS and c.inputs[0].name == v)
                       and c.op not in SHAPE_ONLY_OPS]
            for r in readers:
                accesses.append(Access(r.name, r.op, "read", k, _view_of(an, r)))
                if k > 0:
                    edges.append(DepEdge("RAW", write_nodes[k - 1].name, r.name, name))
                if k < len(write_nodes):
                    edges.append(DepEdge("WAR", r.name, write_nodes[k].name, name))
            if 0 < k < len(write_nodes):
                edges.append(DepEdge("WAW", write_nodes[k - 1].name, write_nodes[k].name, name))
        storages.append(Storage(name, tuple(versions), tuple(accesses)))
    return DepInfo(tuple(storages), tuple(edges))


def copies_removed(deps: DepInfo, fused_nodes: set[str]) -> int:
    """Full-tensor copies onnxruntime makes for scatter nodes that fusion turned into in-kernel selects."""
    return sum(1 for s in deps.storages for a in s.accesses if a.kind == "write" and a.node in fused_nodes)
