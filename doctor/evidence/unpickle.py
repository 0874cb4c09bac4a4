"""Load pickles that are plain data, and nothing else.

Evidence pickles (PyTorch flight-recorder dumps above all) come from jobs we do not control and
from tickets anyone can attach a file to. ``pickle.load`` runs whatever callable a pickle names,
so it is never used on evidence. This loader accepts only what a data dump holds: dicts, lists,
tuples, sets, str, bytes, int, float, bool and None.

How it is enforced, in layers:

1. ``find_class`` refuses every global, so GLOBAL, STACK_GLOBAL and INST cannot name a callable;
   REDUCE, BUILD, OBJ, NEWOBJ and NEWOBJ_EX then have no callable or class to apply and fail.
   ``persistent_load`` refuses persistent ids (PERSID, BINPERSID).
2. EXT1/2/4 fetch objects from the ``copyreg`` extension registry without ``find_class``. It is
   empty in a normal process; when some library has filled it (or ``scan=True``), every opcode
   is first checked against an allowlist of plain-data opcodes (``pickletools.genops``), which
   refuses EXT* (and REDUCE, BUILD, ... by name). The scan is pure Python, about ten times the
   cost of the load, which is why it is not run when nothing needs it.
3. The size is capped before anything is read, and the loaded value is walked without recursion
   to cap nesting depth and item count (a pickle can share one list a million times through its
   memo; code that later walks the value would then do a million times the work).
4. Memory is bounded *before* the load, by the same opcode scan, which now always runs: a memo
   index must be the next free one (``pickle.dump`` never writes another; the C unpickler
   allocates 16 bytes per index, so ``LONG_BINPUT 2**28`` in a 79-byte file costs 4 GB), and
   the opcode and container counts are capped (40 MB of ``EMPTY_DICT`` becomes 3.5 GB). The scan
   is pure Python (about 6 MB/s); flight-recorder dumps are a few MB.

Every refusal is an :class:`UnpickleError` with a one-line reason.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import pickletools
from typing import Any

DEFAULT_MAX_BYTES = 512 * 2**20
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_ITEMS = 50_000_000
#: Opcodes and containers a pickle may hold; each object costs 30-100 bytes once loaded.
DEFAULT_MAX_OPS = 10_000_000
DEFAULT_MAX_CONTAINERS = 2_000_000
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_CONTAINER_OPS = frozenset({"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "LIST", "DICT", "TUPLE", "FROZENSET"})

# Opcodes that build plain data only. Everything else (GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE,
# BUILD, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER) is refused.
SAFE_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "NONE", "NEWTRUE", "NEWFALSE",
    "EMPTY_LIST", "APPEND", "APPENDS", "LIST",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS",
    "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "GET", "BINGET", "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE",
})

_CONTAINER_TYPES = frozenset({dict, list, tuple, set, frozenset})


class UnpickleError(ValueError):
    """The pickle is not plain data, is too big or too deep, or is damaged. One line."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that can build no object but plain containers and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnpickleError(f"refused: the pickle names a global ({module}.{name}); only plain data is read")

    def persistent_load(self, pid: Any) -> Any:
        raise UnpickleError("refused: the pickle uses persistent ids; only plain data is read")


def is_pickle(data: bytes) -> bool:
    """Does ``data`` start like a binary pickle (protocol 2 to 5)?"""
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5


def check_opcodes(data: bytes, max_ops: int = DEFAULT_MAX_OPS,
                  max_containers: int = DEFAULT_MAX_CONTAINERS) -> None:
    """Refuse any opcode outside the plain-data allowlist, a damaged opcode stream, and
    anything that would make the load allocate far more than the pickle's size (see 4. above)."""
    memo = ops = containers = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name not in SAFE_OPCODES:
                raise UnpickleError(f"refused: opcode {name} at byte {pos} can run code; only plain data is read")
            ops += 1
            if name in _PUTS:
                if not isinstance(arg, int) or not 0 <= arg <= memo:
                    raise UnpickleError(f"refused: memo index {arg} at byte {pos} skips ahead (a memory bomb)")
                memo += arg == memo
            elif name == "MEMOIZE":
                memo += 1
            elif name in _CONTAINER_OPS:
                containers += 1
                if containers > max_containers:
                    raise UnpickleError(f"refused: more than {max_containers} containers")
            if ops > max_ops:
                raise UnpickleError(f"refused: more than {max_ops} opcodes")
    except UnpickleError:
        raise
    except Exception as exc:  # genops raises ValueError on truncated or unknown opcodes
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UnpickleError(f"damaged pickle ({first[:160]})") from None


def check_shape(value: Any, max_depth: int = DEFAULT_MAX_DEPTH, max_items: int = DEFAULT_MAX_ITEMS) -> None:
    """Walk the containers of ``value`` level by level: nesting <= max_depth, items <= max_items.

    Only containers are queued, so the walk costs about as much as the load. Leaves need no type check here: with ``find_class`` refusing, the
    unpickler can only build plain types (the one exception, the ``copyreg`` extension cache,
    is closed by the opcode scan that ``safe_loads`` runs whenever that cache is in use).
    Shared references are counted each time they are reached, which is what bounds the work of
    any code that walks the value later.
    """
    cont = _CONTAINER_TYPES
    level: list[Any] = [value] if type(value) in cont else []  # a bare scalar has nothing to walk
    items = 1
    depth = 0
    while level:
        if depth >= max_depth:
            raise UnpickleError(f"refused: nested deeper than {max_depth} levels")
        nxt: list[Any] = []
        push = nxt.append
        for obj in level:
            if type(obj) is dict:
                items += 2 * len(obj)
                for v in obj.values():
                    if type(v) in cont:
                        push(v)
                for k in obj:
                    if type(k) in cont:
                        push(k)
            else:
                items += len(obj)
                for v in obj:
                    if type(v) in cont:
                        push(v)
        if items > max_items:
            raise UnpickleError(f"refused: more than {max_items} items")
        level = nxt
        depth += 1


def _extensions_in_use() -> bool:
    """Has anything in this process registered ``copyreg`` extension codes (EXT1/2/4)?"""
    return bool(copyreg._extension_registry or copyreg._extension_cache)  # type: ignore[attr-defined]


def safe_loads(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, *, max_depth: int = DEFAULT_MAX_DEPTH,
               max_items: int = DEFAULT_MAX_ITEMS, scan: bool | None = None) -> Any:
    """Load a pickle of plain data; raise :class:`UnpickleError` (one line) for anything else.

    ``scan``: kept for callers; the opcode scan now always runs, since it is also what bounds
    memory (a memo index or container bomb is refused before the C unpickler allocates).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UnpickleError("expected bytes")
    data = bytes(data)
    if len(data) > max_bytes:
        raise UnpickleError(f"refused: {len(data)} bytes is over the limit of {max_bytes}")
    if not is_pickle(data):
        raise UnpickleError("not a binary pickle (no protocol 2-5 header)")
    check_opcodes(data)
    try:
        # A BufferedReader gives the C unpickler ``peek``, so it reads ahead instead of calling
        # ``read`` once per opcode (5x faster on the protocol-2 dumps torch writes).
        value = _DataOnlyUnpickler(io.BufferedReader(io.BytesIO(data))).load()
    except UnpickleError:
        raise
    except RecursionError:
        raise UnpickleError(f"refused: nested deeper than {max_depth} levels") from None
    except Exception as exc:  # EOFError, UnpicklingError, MemoryError, ValueError ...
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UnpickleError(f"damaged pickle ({type(exc).__name__}: {first[:160]})") from None
    check_shape(value, max_depth, max_items)
    return value


def safe_load(path: str, max_bytes: int = DEFAULT_MAX_BYTES, **kw: Any) -> Any:
    """Read a file and :func:`safe_loads` it, refusing files over ``max_bytes`` before reading."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    return safe_loads(data, max_bytes, **kw)
