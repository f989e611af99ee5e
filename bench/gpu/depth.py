"""Calls made with the Python stack a chosen number of frames deep, for the
pair benchmarks (pair_cost.py, model_cost.py): what the tensor view costs
grows with the frames it reads."""
import statistics
import sys


def stack_depth():
    """Frames on the calling thread's Python stack, the caller's included."""
    frame, n = sys._getframe(1), 0
    while frame:
        n, frame = n + 1, frame.f_back
    return n


def at_depth(depth, fn, n):
    """fn(n), called with the Python stack depth frames deep, fn's own included."""
    # Plain calls, no *args: a call with *args enters its callee from C, a
    # C-stack shim between every two frames that a plain call chain has not.
    if stack_depth() < depth - 1:
        return at_depth(depth, fn, n)
    return fn(n)


def median_at_depth(depth, fn, n, runs=5):
    """The median of runs calls of fn(n) at depth (at_depth)."""
    # A list, not a generator: a generator's frame, resumed from C by
    # median, would put a frame read alone and a C-stack shim under the
    # measured stack, which a plain call chain of that depth has not.
    return statistics.median([at_depth(depth, fn, n) for _ in range(runs)])
