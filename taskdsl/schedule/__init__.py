"""Scheduling compute definitions into kernels: rule-based schedules, the `td.op` runtime, fusion."""
from .fusion import FusionError, fuse
from .op import Op, op
