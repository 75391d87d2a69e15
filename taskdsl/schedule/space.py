"""Hardware-centric schedule spaces: named axes of choices, pruned by resource checks.

A template declares its space as axes (tile shapes picked from what the hardware offers:
warps per block, lanes per warp, per-thread tiles) and a `check(point)` that returns why a
point cannot run (too much shared memory, too many registers or threads, a tile the load
mappings cannot cover), or None. The valid points are what the tuner enumerates.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Point:
    """One schedule: axis name -> chosen value, usable as `point.bm` or `point["bm"]`."""

    values: tuple       # ((name, value), ...), in axis order

    def __getattr__(self, name):
        for key, value in object.__getattribute__(self, "values"):
            if key == name:
                return value
        raise AttributeError(name)

    def __getitem__(self, name):
        for key, value in self.values:
            if key == name:
                return value
        raise KeyError(name)

    def replace(self, **changes) -> "Point":
        """A copy with some axes changed (ValueError for a name that is no axis; `Space.point` checks values)."""
        unknown = set(changes) - {k for k, _ in self.values}
        if unknown:
            raise ValueError(f"{self} has no axis {', '.join(sorted(unknown))}")
        return Point(tuple((k, changes.get(k, v)) for k, v in self.values))

    def as_dict(self) -> dict:
        """The point as a plain dict (JSON-friendly when the values are)."""
        return dict(self.values)

    def __repr__(self) -> str:
        return "Point(" + ", ".join(f"{k}={v}" for k, v in self.values) + ")"


def _equals_itself(value) -> bool:
    """False for a NaN, or a tuple holding one at any depth."""
    if isinstance(value, tuple):
        return all(map(_equals_itself, value))
    return bool(value == value)


@dataclass
class Space:
    """The cross product of `axes`, minus the points `check` rejects (it returns a reason)."""

    name: str
    axes: dict                      # axis name -> tuple of choices
    check: object = None            # point -> reason string or None
    _valid: list = field(default=None, init=False, repr=False)
    _rejected: Counter = field(default=None, init=False, repr=False)

    def __post_init__(self):
        for name, choices in self.axes.items():
            if not isinstance(name, str) or not name.isidentifier() or hasattr(Point, name) or name == "values":
                raise ValueError(f"space {self.name!r}: axis name {name!r} must be an identifier other than a "
                                 "Point's own attributes (values, replace, as_dict)")
            if isinstance(choices, (str, bytes)) or not hasattr(choices, "__iter__"):
                raise TypeError(f"space {self.name!r}: axis {name!r} needs a tuple of choices, got {choices!r}")
            choices = tuple(choices)
            if not choices:
                raise ValueError(f"space {self.name!r}: axis {name!r} has no choices")
            for value in choices:       # points are dict keys and set members (a list gave the tuner's own TypeError)
                try:
                    hash(value)
                except TypeError:
                    raise TypeError(f"space {self.name!r}: axis {name!r} has the unhashable value {value!r}; make its "
                                    "values numbers, strings, bools or tuples of them") from None
                if not _equals_itself(value):   # a NaN: its point never equals the recorded winner (re-timed each call)
                    raise ValueError(f"space {self.name!r}: axis {name!r} has the value {value!r}, which is not equal "
                                     "to itself (a NaN); give the axis values that compare equal to themselves")
            if any(a == b for i, a in enumerate(choices) for b in choices[i + 1:]):
                raise ValueError(f"space {self.name!r}: axis {name!r} repeats a choice: {choices}")
            self.axes[name] = choices

    def _enumerate(self) -> None:
        if self._valid is not None:
            return
        valid, rejected = [], Counter()      # kept only once complete: a check that raises leaves nothing half-made
        names = list(self.axes)
        for combo in itertools.product(*(self.axes[n] for n in names)):
            point = Point(tuple(zip(names, combo)))
            reason = self.check(point) if self.check else None
            if reason and not isinstance(reason, str):
                raise TypeError(f"space {self.name!r}: its check must return a reason string or None, got "
                                f"{reason!r} for {point}")
            if reason:
                rejected[reason] += 1
            else:
                valid.append(point)
        self._valid, self._rejected = valid, rejected

    @property
    def raw_size(self) -> int:
        """Points before pruning."""
        size = 1
        for choices in self.axes.values():
            size *= len(choices)
        return size

    def points(self) -> list:
        """The valid points, in a fixed order."""
        self._enumerate()
        return list(self._valid)

    def pruned(self) -> Counter:
        """How many points each resource check removed."""
        self._enumerate()
        return Counter(self._rejected)

    def point(self, **values) -> Point:
        """The point with these axis values (ValueError if it is not a valid point)."""
        unknown = set(values) - set(self.axes)
        if unknown or len(values) != len(self.axes):
            raise ValueError(f"a {self.name} point needs exactly the axes {', '.join(self.axes)}")
        off = [n for n in self.axes if values[n] not in self.axes[n]]
        if off:     # a value off an axis is no point of the space, however its check judges it
            raise ValueError(f"{Point(tuple(values.items()))} is not a point of the {self.name} space: {off[0]} must "
                             f"be one of {', '.join(map(str, self.axes[off[0]]))}")
        # the axis's own values (2.0 or True given for 2 or 1 is the point of 2 or 1, as the tuner stores it)
        p = Point(tuple((n, self.axes[n][self.axes[n].index(values[n])]) for n in self.axes))
        reason = self.check(p) if self.check else None
        if reason:
            raise ValueError(f"{p} is not a valid {self.name} schedule: {reason}")
        return p

    def describe(self) -> str:
        """Axes, sizes and what pruning removed, as text (what the docs quote)."""
        lines = [f"{self.name}: {self.raw_size} points, {len(self.points())} valid"]
        lines += [f"  {n}: {', '.join(map(str, c))}" for n, c in self.axes.items()]
        lines += [f"  pruned {count}: {reason}" for reason, count in sorted(self.pruned().items())]
        return "\n".join(lines)
