"""The tensor IR: types, expressions, statements, functions, traversal and printing."""
from .expr import (Atomic, Binary, Buffer, Call, Cast, Const, ConstantError, Expr, Load, Ref, Select, SpecialReg,
                   TruthValueError, Unary, Var, as_expr, binary, const, convert, elementwise_equality, evaluate_int,
                   literal_type, nan_to_zero_operand, structurally_equal)
from .function import Function
from .printer import expr_str, function_str, stmt_str
from .stmt import (Allocate, Assign, Break, CallOutlined, Continue, CpAsync, CpAsyncCommit, CpAsyncWait, Dot4, Evaluate,
                   For, ForMapping, If, LdMatrix, Mma, Outlined, Prefetch, Seq, Stmt, Store, SyncThreads, SyncWarp,
                   While, seq)
from .structure import Unspellable, structural_text
from .types import DataType, TensorSpec
from .visitor import (ELEMENT_ACCESSES, Rewriter, Visitor, allow_deep_trees, collect, invariant, named_buffers,
                      referenced_buffers, substitute)
