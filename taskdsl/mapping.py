"""Task mappings: which worker runs which task (Hidet, ASPLOS'23, section 5.1).

A task mapping assigns the tasks of a task domain of shape ``d = (d0, ..., d_{m-1})``
to the workers ``W_n = {0, ..., n-1}``; ``f(w)`` is the ordered list of task tuples
that worker ``w`` executes.

* ``spatial(*d)`` uses ``prod(d)`` workers; worker ``w`` gets the single task
  ``unravel(w, d)``.
* ``repeat(*d)`` uses one worker that executes every task of ``d`` in order.
* ``ranks`` (both atoms) is a permutation of ``range(m)``: ``ranks[i]`` is the
  significance of dimension ``i``; rank 0 is the most significant (outermost loop,
  slowest varying), rank ``m-1`` the least.  The default ``(0, ..., m-1)`` is row-major.
* ``f1 * f2`` (the paper's ``f1 o f2``) uses ``n1*n2`` workers on the task shape
  ``d1*d2`` (elementwise) and maps ``w`` to
  ``[t1*d2 + t2 for t1 in f1(w // n2) for t2 in f2(w % n2)]``; it is associative.
* ``TaskMapping(task_shape, num_workers, worker_to_tasks)`` is a custom mapping.
  ``worker_to_tasks`` must use only ``+ - * // %`` on ``w`` so that a compiler can
  call it with a symbolic expression in place of an int.

Calling a mapping on an int gives the task list; calling it on anything else (a
symbolic worker index inside a kernel) gives a :class:`MappingLoop` for the frontend.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from .ir.expr import Expr
from .ir.printer import expr_str


def _positive_int(value, what: str) -> int:
    """Return ``value`` as a Python int, or raise ValueError unless it is a positive int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, Expr):     # a kernel's size symbol, a variable or arithmetic on them
            shown = f"'{expr_str(value)}', a value known only when the kernel runs"
        else:
            shown = repr(value)
        raise ValueError(f"{what} must be a positive int fixed when the kernel is written, got {shown}; "
                         "map a fixed tile and loop over the rest")
    if value < 1:
        raise ValueError(f"{what} must be positive, got {value}")
    return int(value)


def _check_shape(shape, what: str) -> tuple[int, ...]:
    """Validate a non-empty shape of positive ints and return it as a tuple."""
    try:
        shape = tuple(shape)
    except TypeError:
        raise ValueError(f"{what} must be a sequence of positive ints, got {shape!r}") from None
    if not shape:
        raise ValueError(f"{what} needs at least one dimension")
    return tuple(_positive_int(d, f"{what} entries") for d in shape)


def _check_ranks(ranks, rank: int) -> tuple[int, ...]:
    """Validate ``ranks`` as a permutation of ``range(rank)``; None means row-major."""
    if ranks is None:
        return tuple(range(rank))
    error = ValueError(f"ranks must be a permutation of range({rank}), got {ranks!r}")
    try:
        checked = tuple(ranks)
    except TypeError:
        raise error from None
    if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) for r in checked):
        raise error
    if sorted(checked) != list(range(rank)):
        raise error
    return tuple(int(r) for r in checked)


def unravel(index, shape, ranks=None) -> tuple:
    """Split a flat ``index`` into coordinates of ``shape`` using only ``//`` and ``%``.

    The dimension with the highest rank varies fastest. ``index`` may be a symbolic
    expression; the arithmetic is ``(index // stride) % d`` for every dimension (the
    ``// 1`` of the fastest dimension is omitted) and a dimension of size 1 gives 0.
    """
    shape = _check_shape(shape, "shape")
    ranks = _check_ranks(ranks, len(shape))
    coords = [0] * len(shape)
    stride = 1
    for dim in sorted(range(len(shape)), key=lambda i: ranks[i], reverse=True):
        if shape[dim] > 1:
            coords[dim] = (index if stride == 1 else index // stride) % shape[dim]
        stride *= shape[dim]
    return tuple(coords)


@dataclass(frozen=True, eq=False)
class MappingLoop:
    """A mapping applied to a symbolic worker index: a loop source the frontend lowers."""

    mapping: "TaskMapping"
    worker: object


def _applied_operand(mapping: "TaskMapping", applied, self_first: bool) -> str:
    """The message for ``mapping * inner(w)`` (or ``outer(w) * mapping``): a call binds tighter than ``*``, so
    one operand is a mapping already applied to a worker (a MappingLoop in a kernel, a list of tasks outside)."""
    other = repr(applied.mapping) if isinstance(applied, MappingLoop) else "inner"
    outer, inner = (repr(mapping), other) if self_first else (other, repr(mapping))
    return (f"a task mapping composes with a mapping, not with one applied to a worker: a call binds tighter than "
            f"'*'; compose first, then apply the composition: ({outer} * {inner})(worker)")


class TaskMapping:
    """A task mapping; instantiate it directly for a custom ``worker_to_tasks`` function."""

    def __init__(self, task_shape, num_workers, worker_to_tasks):
        """Create a custom mapping of ``num_workers`` workers over ``task_shape``."""
        if not callable(worker_to_tasks):
            raise TypeError(f"worker_to_tasks must be callable, got {worker_to_tasks!r}")
        self._task_shape = _check_shape(task_shape, "task_shape")
        self._num_workers = _positive_int(num_workers, "num_workers")
        self.worker_to_tasks = worker_to_tasks

    @property
    def task_shape(self) -> tuple[int, ...]:
        """The shape of the task domain."""
        return self._task_shape

    @property
    def num_workers(self) -> int:
        """The number of workers."""
        return self._num_workers

    def __call__(self, w):
        """Tasks of worker ``w`` (an int), or a :class:`MappingLoop` for a symbolic ``w``."""
        if isinstance(w, Expr) and not isinstance(w, bool):
            return MappingLoop(self, w)
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)):
            raise TypeError(f"worker index must be an int, or an integer value of a kernel such as threadIdx.x, "
                            f"got {w!r}")
        if not 0 <= w < self.num_workers:
            raise ValueError(f"worker {w} is out of range: valid workers are 0..{self.num_workers - 1}")
        return self._tasks(int(w))

    def on(self, w):
        """Same as calling the mapping: ``m.on(w) == m(w)``."""
        return self(w)

    def _tasks(self, w: int) -> list[tuple[int, ...]]:
        """Validated tasks of the in-range int worker ``w``."""
        tasks = []
        for task in self.worker_to_tasks(w):
            if not isinstance(task, tuple) or len(task) != len(self.task_shape):
                raise ValueError(f"worker {w}: task {task!r} is not a tuple of rank {len(self.task_shape)}")
            if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in task):
                raise ValueError(f"worker {w}: task {task!r} is not a tuple of ints (use // for division)")
            if not all(0 <= t < d for t, d in zip(task, self.task_shape)):
                raise ValueError(f"worker {w}: task {task!r} is outside task_shape {self.task_shape}")
            tasks.append(tuple(int(t) for t in task))
        return tasks

    def __mul__(self, other):
        """Compose ``self`` (outer) with ``other`` (inner)."""
        if isinstance(other, (MappingLoop, list)):
            raise TypeError(_applied_operand(self, other, self_first=True))
        if not isinstance(other, TaskMapping):
            return NotImplemented
        return ComposedMapping(self, other)

    def __rmul__(self, other):
        """An applied mapping times this one: the TypeError of `_applied_operand` (a mapping times a mapping is
        ``__mul__``'s)."""
        if isinstance(other, (MappingLoop, list)):
            raise TypeError(_applied_operand(self, other, self_first=False))
        return NotImplemented

    def atoms(self) -> list["TaskMapping"]:
        """The non-composed mappings of this mapping, outermost first."""
        return [self]

    def worker_of(self) -> np.ndarray:
        """An int64 array of shape ``task_shape`` with the worker of each task (-1: none)."""
        owner = np.full(self.task_shape, -1, dtype=np.int64)
        for w in range(self.num_workers):
            for task in self._tasks(w):
                if owner[task] not in (-1, w):
                    raise ValueError(f"task {task} is run by both worker {owner[task]} and worker {w}")
                owner[task] = w
        return owner

    def table(self) -> str:
        """The worker of each task as a text grid ('.' marks a task no worker runs)."""
        owner = self.worker_of()
        width = len(str(max(owner.max(), owner.shape[-1] - 1)))
        if owner.ndim == 1:
            return " ".join(_cell(v, width) for v in owner)
        blocks = []
        for lead in np.ndindex(*owner.shape[:-2]):
            grid = _grid_text(owner[lead], width)
            blocks.append(f"[{', '.join(map(str, lead))}, :, :]\n{grid}" if lead else grid)
        return "\n\n".join(blocks)

    def show(self, path=None):
        """Print :meth:`table`, or save a PNG picture of the worker grid to ``path`` and return it."""
        if path is None:
            print(self.table())
            return None
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
            from matplotlib import colormaps
        except ImportError as err:
            raise ImportError("TaskMapping.show(path) needs matplotlib: pip install matplotlib") from err
        owner = self.worker_of()
        grid = owner.reshape(-1, owner.shape[-1])
        rows, cols = grid.shape
        palette = colormaps["tab20"]
        image = np.ones((rows, cols, 4))
        image[grid >= 0] = palette(grid[grid >= 0] % palette.N)
        cell = min(0.5, 12.0 / max(rows, cols))
        fig = Figure(figsize=(max(2.0, cols * cell), max(1.0, rows * cell)))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.imshow(image, interpolation="nearest")
        ax.set_title(repr(self), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        if owner.ndim >= 3:
            for r in range(owner.shape[-2], rows, owner.shape[-2]):
                ax.axhline(r - 0.5, color="black", linewidth=1)
        if max(rows, cols) <= 32:
            for (r, c), v in np.ndenumerate(grid):
                if v >= 0:
                    ax.text(c, r, str(v), ha="center", va="center", fontsize=7)
        fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
        return path

    def _key(self) -> tuple:
        """The identity used by ``==`` and ``hash``: custom mappings compare by identity."""
        return ("custom", id(self))

    def structural_key(self) -> tuple:
        """The mapping as plain values, for keys that outlive the process (`ir.structural_text`); a custom
        mapping has none (its tasks come from a Python function): ir.Unspellable."""
        if any(atom._key()[0] == "custom" for atom in self.atoms()):
            from .ir import Unspellable
            raise Unspellable("structural_text: a custom task mapping maps by a Python function")
        return self._key()

    def __eq__(self, other):
        """Structural equality for built-in mappings, identity for custom ones."""
        if not isinstance(other, TaskMapping):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        """Hash consistent with ``==``."""
        return hash(self._key())

    def __repr__(self):
        """A short description of the mapping."""
        return f"TaskMapping(task_shape={self.task_shape}, num_workers={self.num_workers})"


def _cell(value, width: int) -> str:
    """One right-aligned table cell; -1 (no worker) shows as '.'."""
    return ("." if value < 0 else str(value)).rjust(width)


def _grid_text(grid: np.ndarray, width: int) -> str:
    """A 2-D worker grid with column indices on top and row indices on the left."""
    row_width = len(str(grid.shape[0] - 1))
    lines = [" " * (row_width + 1) + " ".join(str(c).rjust(width) for c in range(grid.shape[1]))]
    for r, row in enumerate(grid):
        lines.append(f"{str(r).rjust(row_width)}|" + " ".join(_cell(v, width) for v in row))
    return "\n".join(lines)


class _AtomMapping(TaskMapping):
    """Shared parts of the spatial and repeat atoms."""

    _name = ""

    def __init__(self, dims, ranks):
        """Store the validated ``dims`` and ``ranks``; the subclass sets ``_num_workers``."""
        self.dims = _check_shape(dims, f"{self._name} dims")
        self.ranks = _check_ranks(ranks, len(self.dims))
        self._task_shape = self.dims

    def _key(self) -> tuple:
        """Structural identity: the class, dims and ranks."""
        return (type(self).__name__, self.dims, self.ranks)

    def __repr__(self):
        """E.g. ``spatial(2, 3, ranks=[1, 0])``; default ranks are omitted."""
        args = ", ".join(map(str, self.dims))
        if self.ranks != tuple(range(len(self.dims))):
            args += f", ranks={list(self.ranks)}"
        return f"{self._name}({args})"


class SpatialMapping(_AtomMapping):
    """``prod(dims)`` workers, each running the single task ``unravel(w, dims, ranks)``."""

    _name = "spatial"

    def __init__(self, dims, ranks=None):
        """Create the spatial mapping over ``dims``."""
        super().__init__(dims, ranks)
        self._num_workers = math.prod(self.dims)

    def _tasks(self, w: int) -> list[tuple[int, ...]]:
        """The single task of worker ``w``."""
        return [unravel(w, self.dims, self.ranks)]


class RepeatMapping(_AtomMapping):
    """One worker running every task of ``dims`` in ``ranks`` order."""

    _name = "repeat"

    def __init__(self, dims, ranks=None):
        """Create the repeat mapping over ``dims``."""
        super().__init__(dims, ranks)
        self._num_workers = 1

    @functools.cached_property
    def _all_tasks(self) -> list:
        # the task order of `unravel`, built by a product over the dimensions from slowest (lowest rank) to
        # fastest: kernels build mappings every time they are translated
        order = sorted(range(len(self.dims)), key=lambda d: self.ranks[d])
        tasks = []
        for combo in itertools.product(*(range(self.dims[d]) for d in order)):
            task = [0] * len(order)
            for d, c in zip(order, combo):
                task[d] = c
            tasks.append(tuple(task))
        return tasks

    def _tasks(self, w: int) -> list[tuple[int, ...]]:
        """All tasks, in iteration order."""
        return list(self._all_tasks)


class ComposedMapping(TaskMapping):
    """The composition ``outer * inner`` (the paper's ``outer o inner``)."""

    def __init__(self, outer: TaskMapping, inner: TaskMapping):
        """Compose two mappings whose task shapes have the same rank."""
        if not isinstance(outer, TaskMapping) or not isinstance(inner, TaskMapping):
            raise TypeError(f"can only compose TaskMappings, got {outer!r} and {inner!r}")
        if len(outer.task_shape) != len(inner.task_shape):
            raise ValueError(
                f"cannot compose task shapes of different rank: {outer.task_shape} and {inner.task_shape}"
            )
        self.outer, self.inner = outer, inner
        self._task_shape = tuple(a * b for a, b in zip(outer.task_shape, inner.task_shape))
        self._num_workers = outer.num_workers * inner.num_workers

    def _tasks(self, w: int) -> list[tuple[int, ...]]:
        """Combine the outer tasks of ``w // n2`` with the inner tasks of ``w % n2``."""
        n2, d2 = self.inner.num_workers, self.inner.task_shape
        return [
            tuple(a * d + b for a, b, d in zip(t1, t2, d2))
            for t1 in self.outer._tasks(w // n2)
            for t2 in self.inner._tasks(w % n2)
        ]

    def atoms(self) -> list[TaskMapping]:
        """The leaves of the composition, outermost first."""
        return self.outer.atoms() + self.inner.atoms()

    def _key(self) -> tuple:
        """Structural identity: the atoms (so grouping does not matter)."""
        return ("composed", tuple(a._key() for a in self.atoms()))

    def __repr__(self):
        """The atoms joined by ``*``."""
        return " * ".join(repr(a) for a in self.atoms())


def spatial(*dims, ranks=None) -> SpatialMapping:
    """The spatial mapping over task shape ``dims``: one task per worker."""
    return SpatialMapping(dims, ranks)


def repeat(*dims, ranks=None) -> RepeatMapping:
    """The repeat mapping over task shape ``dims``: one worker runs all tasks."""
    return RepeatMapping(dims, ranks)
