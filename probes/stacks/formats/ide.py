"""IDE call-stack copies (VS Code, CLion, Visual Studio, WinDbg): ``module!function`` frames, only
taken when the modules are recognisably binaries, so prose with ``!`` is not a stack.
"""

from __future__ import annotations

import re
import sys

from doctor.probes.stacks.formats.common import clean_native
from doctor.probes.stacks.model import RawProc, RawThread

# An IDE's call-stack copy (VS Code / CLion / Visual Studio): ``lib.so!func(args) (file:line)``,
# ``python311.dll!take_gil(...) Line 285 C``, WinDbg ``ntdll!NtWaitForSingleObject+0x14``.
IDE_FRAME = re.compile(r"^\s*>?\s*(?P<mod>[A-Za-z_][\w.+-]*)!(?P<func>[^\s!(][^!]*?)"
                        r"(?:\s+\((?P<file>[^()]*?):(?P<line>\d+)\)|\s+Line (?P<vsline>\d+)(?:\s.*)?)?\s*$")
_IDE_BINARY = re.compile(r"(?:\.so(?:\.\d+)*|\.dll|\.dylib|\.exe|\.pyd)$|^(?:lib|python)", re.I)
IDE_OTHER = re.compile(r"^\s*\[(?:External Code|Unknown/Just-In-Time compiled code|Frames below may be incorrect[^\]]*)\]\s*$")


def parse_ide(lines: list[str], notes: list[str]) -> list[RawProc]:
    """An IDE's call-stack copy, innermost first, one thread: native frames ``module!function``
    with the source location when the IDE had it."""
    t = RawThread("", "")
    for ln in lines:
        m = IDE_FRAME.match(ln)
        if not m:
            continue
        func = re.sub(r"\+0x[0-9a-fA-F]+$", "", m.group("func").strip())  # WinDbg offsets
        if m.group("file"):
            file, line = m.group("file").removeprefix("./"), int(m.group("line"))
        else:
            file, line = m.group("mod"), int(m.group("vsline") or 0)
        t.frames.append((clean_native(func) or "??", sys.intern(file), line, True))
    return [RawProc(None, "ide", threads=[t])] if t.frames else []


def ide_frames(lines: list[str]) -> int:
    """IDE frame lines whose module is recognisably a binary (``.so``, ``.dll``, ``lib*``)."""
    n = 0
    for ln in lines:
        if "!" in ln:
            m = IDE_FRAME.match(ln)
            n += bool(m and _IDE_BINARY.search(m.group("mod")))
    return n
