"""Rewrite: each kernel's group becomes one `ai.evonnx::Fused` node; values known at plan time become constants.

Precondition: specs from `lower_groups` on this graph. Postcondition: a new, toposorted graph in which every
fused output carries its element type and symbolic shape (graph-input dim_params by name; other symbolic sizes
left unknown, never a sample size), and nodes nobody reads are gone. Unfused nodes stay as they are. The input
graph is not modified.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_graphsurgeon as gs

from evonnx.index import Poly, Sym
from evonnx.model import DOMAIN
from evonnx.passes.analyze import CANNOT_FAIL, Analysis, computed_whole, node_reads
from evonnx.passes.ort_layout import NOT_FOLDED
from evonnx.records import KernelSpec, kernel_fingerprint

FUSED_OP = "Fused"


def _dim(d: Poly, an: Analysis) -> int | str | None:
    if d.const is not None:
        return d.const
    s = d.atom()
    if isinstance(s, Sym) and s.name in an.dim_params:
        return s.name
    return None


def rewrite(g: gs.Graph, specs: Sequence[KernelSpec], an: Analysis) -> gs.Graph:
    gone = _removed_by_onnxruntime(g)
    g = g.copy()
    # Live: read on the way to an output once plan-time folding is done, with every kernel's nodes still reading
    # what they read (their values travel into the kernel). The folding may leave a node unread that onnxruntime
    # runs anyway (fuzz case 5155: Sub(x[N, 3], y[M, 3]) read only through Shape(start=-1), folded to [3];
    # onnxruntime still runs the Sub and fails where N and M do not broadcast).
    folded = g.copy()
    _fold_known(folded, an)
    live = _live_nodes(folded)
    whole = computed_whole(g, an)
    tensors = g.tensors()
    by_name = {n.name: n for n in g.nodes}
    for spec in specs:
        for name in spec.source_nodes:
            by_name[name].inputs.clear()
            by_name[name].outputs.clear()
        outs = []
        for o in spec.outputs:
            t = tensors[o.name]
            t.dtype = np.dtype(o.dtype)
            t.shape = [_dim(d, an) for d in o.shape]
            if o.empty_shape is not None:
                t.shape = None  # its rank is another where it is empty (KernelOutput.empty_shape)
            elif spec.checks and any(c.op in ("Shape", "Size") for c in t.outputs):
                # onnxruntime folds Shape of a declared static shape and then never runs the kernel, whose size
                # checks the original would have failed on (a Mul of N against M read only through a Slice's
                # shape): the dims stay undeclared, so that the kernel runs
                t.shape = [None] * len(o.shape)
            outs.append(t)
        attrs = {"kernel": spec.name, "fingerprint": kernel_fingerprint(spec)}
        g.nodes.append(gs.Node(op=FUSED_OP, name=spec.name, domain=DOMAIN, attrs=attrs,
                               inputs=[tensors[i.name] for i in spec.inputs], outputs=outs))
    _fold_known(g, an)
    # A node onnxruntime runs in the original may fail there (a ScatterND index out of a symbolic axis); when
    # evonnx no longer needs its result (its shape was all that was read, and that is known) it must still run,
    # or the optimized model would return where the original fails. onnxruntime runs nodes nobody reads, so such
    # nodes stay, their outputs unread (kept through cleanup as temporary graph outputs): the nodes evonnx did
    # not lower, whose values it no longer computes (the kernels export what they read: `left_and_may_fail`,
    # fuzz case 642). A lowered node's failures are size checks that travel with
    # its values into the kernels that read them, except where no output reads it in the planned graph either:
    # onnxruntime's folding (`fold_like_onnxruntime`) turns a Shape of a static shape into a constant and keeps,
    # and runs, the nodes that computed its input (fuzz case 1468: a ScatterND whose updates never fit, read only
    # through Shape(ReduceMax), failed in onnxruntime at every size). Such nodes stay too, as do kernels with size
    # checks that nothing reads any more.
    # And an integer Div or Mod whose divisor may be 0 fails on values that nothing may read (`computed_whole`;
    # fuzz case 3231: Mod(N, N) read through a Slice that is empty, known at plan time, failed at N = 0), so it
    # stays too, or the kernel that computes it.
    # But not a node that onnxruntime's own folding removes from the original (`_removed_by_onnxruntime`).
    checked = {spec.name for spec in specs if spec.checks or any(o.name in whole for o in spec.outputs)}
    available = _Available(g)

    def must_still_run(n: gs.Node) -> bool:
        """Whether `n` stays though nothing may read it: a kernel with checks or a whole-computed output, or a node
        left to onnxruntime that can fail and that is not lowered, or is unread, or computes a whole-computed
        output, and that onnxruntime runs in the original (above)."""
        if n.name in checked:
            return True
        if n.domain == DOMAIN or n.op in CANNOT_FAIL or n.name in gone:
            return False
        return (n.name not in live or not isinstance(an.lowered.get(n.name), list)
                or any(o.name in whole for o in n.outputs))

    keep = [t for n in g.nodes if n.outputs and must_still_run(n) and all(available(t) for t in n.inputs)
            for t in n.outputs if t not in g.outputs]
    g.outputs.extend(keep)
    g.cleanup(remove_unused_graph_inputs=False).toposort()
    del g.outputs[len(g.outputs) - len(keep):]
    return g



def _removed_by_onnxruntime(g: gs.Graph) -> set[str]:
    """The nodes of `g` that onnxruntime removes before it runs anything: its constant folding turns a Shape whose
    input has a static shape (whatever its start and end) into a constant, then drops every node whose results
    only such Shapes, or nodes it dropped, read; not a Size, nor a Shape of a partly symbolic shape, and a node
    that nothing reads in `g` itself it keeps and runs (measured on onnxruntime 1.31, every optimization level:
    Neg -> Shape(start=-1) of [M] -> Shape and Neg -> ReduceMax -> Shape of [2, 3] run nothing, Neg -> Size or
    Shape of [M, 3] run the Neg). Fuzz case 595 of seed 28000000: a float16 ScatterElements with a reduction,
    which onnxruntime cannot run, read only through Shape(Shape(.)), was kept as a node that may fail, and the
    optimized model failed where the original runs."""
    readers: dict[str, list[str]] = {}
    for n in g.nodes:
        for name in node_reads(n):  # an If/Loop body's captures included: such a node is kept
            readers.setdefault(name, []).append(n.name)
    outputs = {t.name for t in g.outputs}
    removed: set[str] = set()
    for n in reversed(g.nodes):  # toposorted: every reader before the node it reads
        shape = n.inputs[0].shape if n.op == "Shape" and n.domain in (None, "", "ai.onnx") and n.inputs else None
        if shape is not None and all(isinstance(d, int) and d >= 0 for d in shape):
            removed.add(n.name)
            continue
        names = [t.name for t in n.outputs if t.name]
        read = [r for name in names for r in readers.get(name, [])]
        if read and not any(name in outputs for name in names) and all(r in removed for r in read):
            removed.add(n.name)
    return removed


def _live_nodes(g: gs.Graph) -> set[str]:
    """Names of the nodes whose results reach a graph output."""
    needed = {t.name for t in g.outputs}
    live: set[str] = set()
    for n in reversed(g.nodes):  # in topological order, as ONNX requires
        if any(t.name in needed for t in n.outputs):
            live.add(n.name)
            needed.update(node_reads(n))
    return live


class _Available:
    """Whether the rewritten graph can still compute a tensor: an input, a constant, or the output of a node it
    keeps whose inputs it can compute, all the way up (a node nobody read may read, through a Shape, a tensor
    that a kernel computes inside and does not export). Memoised per tensor."""

    def __init__(self, g: gs.Graph):
        self.inputs = {t.name for t in g.inputs}
        self.memo: dict[str, bool] = {}  # a graph has no cycle: each tensor is decided once its producer's inputs are

    def _known(self, t: gs.Tensor) -> bool | None:
        if not t.name or isinstance(t, gs.Constant) or t.name in self.inputs:
            return True
        return self.memo.get(t.name)

    def __call__(self, t: gs.Tensor) -> bool:
        stack: list[tuple[gs.Tensor, bool]] = [(t, False)]
        while stack:  # depth first, producers' inputs before the tensor, without recursion (deep chains)
            cur, expanded = stack.pop()
            if self._known(cur) is not None:
                continue
            ins = [i for p in cur.inputs for i in p.inputs]
            if expanded:
                self.memo[cur.name] = bool(cur.inputs) and all(self._known(i) for i in ins)
                continue
            stack.append((cur, True))
            stack.extend((i, False) for i in ins if self._known(i) is None)
        return bool(self._known(t))


def _fold_known(g: gs.Graph, an: Analysis) -> None:
    """Nodes whose every output is a constant known at plan time (folded shape arithmetic) become constants,
    unless a constant holds only under a run-time size condition (its checks): such a node stays with onnxruntime,
    which checks it as the original model does."""
    outputs = {t.name for t in g.outputs}
    for n in g.nodes:
        if n.domain == DOMAIN or not n.outputs or any(t.name in outputs for t in n.outputs) or n.op in NOT_FOLDED:
            continue
        arrays = []
        for t in n.outputs:
            info = an.tensors.get(t.name)
            if info is not None and info.checks:
                break
            arr = info.known.array() if info is not None and info.known is not None else None
            if arr is None:
                break
            arrays.append(arr)
        else:
            for t, arr in zip(list(n.outputs), arrays):
                t.to_constant(np.array(arr, order="C"))  # ascontiguousarray would make 0-d arrays 1-d
            n.outputs.clear()
            n.inputs.clear()
