"""Scheduling compute definitions into kernels: rule-based schedules and the `td.op` runtime."""
from .op import Op, op
