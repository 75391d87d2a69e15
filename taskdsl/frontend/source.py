"""Parsed source of a decorated Python function, with positions mapped back to the user's file."""
from __future__ import annotations

import __future__
import ast
import functools
import inspect
import linecache
import os
from dataclasses import dataclass

from ..errors import DSLError, SourceLoc


@dataclass(frozen=True)
class ParsedSource:
    """The FunctionDef of a Python function, and the offsets that map its positions to the file."""

    tree: ast.FunctionDef
    file: str
    line_offset: int
    col_offset: int
    lines: tuple = ()           # the parsed text's lines (ast's columns count UTF-8 bytes in them)

    def loc(self, node: ast.AST) -> SourceLoc:
        """The file position of an AST node (its column in characters)."""
        col = node.col_offset
        if 0 < node.lineno <= len(self.lines):
            col = len(self.lines[node.lineno - 1].encode()[:col].decode(errors="ignore"))
        return SourceLoc(self.file, node.lineno + self.line_offset, col + self.col_offset)


def closure_values(fn) -> dict:
    """The names `fn` reads from enclosing functions, with their values now. A cell still empty (a function
    defined further down the enclosing one, which `fn` calls) is left out: it is read again at translation."""
    values = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            values[name] = cell.cell_contents
        except ValueError:      # empty until the enclosing function binds it
            pass
    return values


_TEXT_AT_DECORATION = "__taskdsl_text__"


def remember_text(fn) -> None:
    """Keep the text of `fn`'s file as it is when `fn` is decorated (the text Python ran), for `parse_function`:
    an edit of a local's annotation changes no bytecode, so only the text tells it."""
    file = fn.__code__.co_filename
    setattr(fn, _TEXT_AT_DECORATION, (_text_version(file), linecache.getlines(file)))


def parse_function(fn) -> ParsedSource:
    """Parse the source of `fn`; a clear error where Python cannot find it (e.g. `exec` strings), or where the def's
    text changed since `remember_text` kept it (the file edited and not reloaded)."""
    code = fn.__code__
    version = _text_version(code.co_filename)
    try:
        parsed = _parse_code(code, code.co_filename, version)
    except (OSError, TypeError) as exc:
        raise DSLError(f"cannot read the source of '{fn.__qualname__}' ({exc}); kernels must be defined in a "
                       "file, a notebook cell or a REPL that keeps source (IPython; the plain python REPL from "
                       "Python 3.13), not `python -c`, an exec'd string or an older plain python REPL",
                       SourceLoc(code.co_filename, code.co_firstlineno)) from None
    kept = getattr(fn, _TEXT_AT_DECORATION, None)
    if kept is not None and kept[0] != version:     # the file changed: the def's lines too?
        span = slice(parsed.line_offset, parsed.line_offset + len(parsed.lines))
        if kept[1][span] != linecache.getlines(code.co_filename)[span]:
            raise _changed_since_run(code, parsed.file)
    return parsed


def _text_version(file: str) -> tuple:
    """What tells one text of `file` from another in linecache, which `inspect` reads: its size and modification
    time, or for text a REPL registered, the text itself."""
    linecache.checkcache(file)
    lines = linecache.getlines(file)
    entry = linecache.cache.get(file, ())
    return tuple(entry[:2]) if len(entry) == 4 and entry[1] is not None else (hash("".join(lines)),)


@functools.lru_cache(maxsize=1024)
def _parse_code(code, code_file: str, version: tuple) -> ParsedSource:
    """The parsed source of a code object: once, for the many functions a template factory makes of one def
    (a schedule space's kernels). Code objects compare by content, not by file: `code_file` (the code's
    co_filename) keeps two equal defs of two files apart, and `version` (`_text_version`) two texts of one file
    whose code is equal (an edit of a local's annotation, reloaded)."""
    lines, first_line = inspect.getsourcelines(code)
    file = inspect.getsourcefile(code) or inspect.getfile(code)
    # the def's own indent off every line that has it (textwrap.dedent did nothing where a docstring's line
    # starts at column 0, and the nested def failed to parse)
    indent = len(lines[0]) - len(lines[0].lstrip())
    prefix = lines[0][:indent]
    dedented = "".join(line[indent:] if line.startswith(prefix) else line for line in lines)
    try:
        tree = ast.parse(dedented).body[0]
    except (SyntaxError, IndexError):
        tree = None
    if not isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)) or tree.name != code.co_name:
        # the text linecache holds under the code's file name is not this def: an exec'd string whose name
        # ("<string>") other text was registered under, or a file edited since it was imported
        if os.path.isfile(code_file):
            raise _changed_since_run(code, file)
        raise OSError(f"the text at {code_file}:{code.co_firstlineno} is not the def of '{code.co_name}'")
    if isinstance(tree, ast.AsyncFunctionDef):
        raise DSLError("kernels cannot be async functions", SourceLoc(file, first_line))
    if not _text_is_the_code(code, code_file, version, tree, file):
        raise _changed_since_run(code, file)
    return ParsedSource(tree, file, first_line - 1, indent, tuple(dedented.splitlines()))


def _text_is_the_code(code, code_file: str, version: tuple, tree: ast.FunctionDef, file: str) -> bool:
    """Whether the text the def was parsed from is the code Python ran: the bytecode Python makes of the whole
    text (the def in its context: closures, the module's future imports) for the def at the code's first line is
    the code's. Where the whole text does not compile (a notebook cell with magics), the def compiled alone is
    compared by constants and names (which misses an edited operator), and a closure not at all."""
    ran = _code_objects(code_file, version, code.co_flags & _FUTURE_FLAGS)
    if ran is not None:
        twin = ran.get((code.co_name, code.co_firstlineno))
        return twin is not None and _same_code(twin, code)
    return bool(code.co_freevars) or _code_shape(_compiled_def(tree, file)) == _code_shape(code)


_FUTURE_FLAGS = functools.reduce(lambda a, b: a | b, (getattr(__future__, f).compiler_flag
                                                      for f in __future__.all_feature_names)) & ~0xFFFF


@functools.lru_cache(maxsize=16)
def _code_objects(code_file: str, version: tuple, flags: int) -> dict | None:
    """The code objects Python makes of the text linecache holds for `code_file`, by (name, first line); None
    where the text does not compile by itself."""
    try:
        module = compile("".join(linecache.getlines(code_file)), code_file, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    found, pending = {}, [module]
    while pending:
        for const in pending.pop().co_consts:
            if inspect.iscode(const):
                found.setdefault((const.co_name, const.co_firstlineno), const)
                pending.append(const)
    return found


def _same_code(a, b) -> bool:
    """Whether two code objects run the same operations on the same constants and names."""
    fields = lambda c: (c.co_code, c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars, len(c.co_consts))
    if fields(a) != fields(b):
        return False
    return all(_same_code(x, y) if inspect.iscode(x) and inspect.iscode(y) else
               type(x) is type(y) and repr(x) == repr(y) for x, y in zip(a.co_consts, b.co_consts))


def _changed_since_run(code, file: str) -> DSLError:
    """The error for a def whose text in its file is not the code Python ran: the file was edited after it was
    imported (or an editor ran a buffer it had not saved), and a kernel built from the text would silently run
    other code than the function's."""
    return DSLError(f"the text of '{code.co_name}' in {file} is not the code Python ran: the file changed since it "
                    "was run", SourceLoc(file, code.co_firstlineno),
                    "Reload the module (importlib.reload) or run the cell or file again (saved).")


def _compiled_def(tree: ast.FunctionDef, file: str):
    """The code object Python makes of the def `tree` alone (with no future features of this module)."""
    module = compile(ast.Module(body=[tree], type_ignores=[]), file, "exec", dont_inherit=True)
    return next(c for c in module.co_consts if inspect.iscode(c) and c.co_name == tree.name)


def _code_shape(code) -> tuple:
    """What the code objects of one text share wherever it is compiled, and two texts' mostly differ in: constants
    and names. (Not the bytecode: Python 3.11 calls a method of a name its module imports differently, and the
    def compiled alone does not know the module's imports.)"""
    consts = tuple(_code_shape(c) if inspect.iscode(c) else (type(c).__name__, repr(c)) for c in code.co_consts
                   if not isinstance(c, str))   # (a nested def's docstring loses its indent with the dedent)
    return consts, code.co_names, code.co_varnames
