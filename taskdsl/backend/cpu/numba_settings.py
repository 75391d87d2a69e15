"""Settings numba reads once, when it is imported: made here, before taskdsl imports numba.

numba's type inference raises and catches thousands of exceptions while it types a generated kernel (a failed
literal typing for each of its constants, a failed `typeof` for each operator it looks up), and with error
highlighting on (numba's default where colorama is installed), numba wraps each one's message in terminal escapes,
starting and stopping colorama for it.
Off, ResNet-50's fused convolutions compile about 8% faster (docs/benchmarks.md, session 64); the messages keep
their text. A process that imported numba before taskdsl keeps numba's setting, as does one whose environment
sets NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING already (empty: highlighting on).
"""
import os

os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
