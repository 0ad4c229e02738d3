"""SASS offset -> source line, from a cubin's DWARF line table (issue D's coalescing tool).

A cubin built with line info (``nvcc -lineinfo``, ``-G``, NVRTC ``--generate-line-info``)
has a ``.debug_line`` section whose sequences map each function's SASS offsets to
``file:line``.  Each sequence starts with a ``DW_LNE_set_address`` that a relocation in
``.rela.debug_line`` ties to the function's ``.text.<name>`` section, in the same order,
which is how a sequence is given its function.  Parsed with pyelftools (a dependency of
cupti-python); without it, or without line info, there are simply no lines.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

import numpy as np

LineTable = dict[str, tuple[np.ndarray, list[str]]]  # function -> (sorted offsets, "file:line" per offset)


def line_table(image: bytes) -> LineTable:
    """Per function: the SASS offsets where a new source line starts, and those lines."""
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return {}
    try:
        elf = ELFFile(io.BytesIO(image))
        dl = elf.get_section_by_name(".debug_line")
        rel = elf.get_section_by_name(".rela.debug_line")
        symtab = elf.get_section_by_name(".symtab")
        if dl is None or rel is None or symtab is None:
            return {}
        funcs = []
        for r in sorted(rel.iter_relocations(), key=lambda r: r["r_offset"]):
            sec = elf.get_section(symtab.get_symbol(r["r_info_sym"])["st_shndx"])
            funcs.append(sec.name.removeprefix(".text."))
        dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
        out: LineTable = {}
        seq, offset = 0, 0
        while offset < dl["sh_size"]:
            prog = dwarf._parse_line_program_at_offset(offset, dwarf.structs)  # no .debug_info in cubins
            names = [fe.name.decode() for fe in prog.header["file_entry"]]
            dirs = [d.decode() for d in prog.header["include_directory"]]
            addr: list[int] = []
            where: list[str] = []
            for e in prog.get_entries():
                st = e.state
                if st is None:
                    continue
                if st.end_sequence:
                    if seq < len(funcs) and addr:
                        order = np.argsort(addr, kind="stable")
                        out[funcs[seq]] = (np.asarray(addr, np.int64)[order], [where[i] for i in order])
                    seq += 1
                    addr, where = [], []
                    continue
                fe = prog.header["file_entry"][st.file - 1] if 0 < st.file <= len(names) else None
                name = names[st.file - 1] if fe is not None else "?"
                if fe is not None and 0 < fe.dir_index <= len(dirs) and not name.startswith("/"):
                    name = f"{dirs[fe.dir_index - 1]}/{name}"
                addr.append(st.address)
                where.append(f"{name}:{st.line}")
            offset = prog.program_end_offset
        return out
    except Exception:  # a foreign or truncated image: no lines, never an error in the capture
        return {}


@lru_cache(maxsize=256)
def _table_of(path: str) -> LineTable:
    try:
        return line_table(Path(path).read_bytes())
    except OSError:
        return {}


def source_lines(cubin: str | None, function: str, pcs: np.ndarray) -> list[str | None]:
    """``file:line`` of each function-relative PC (None where the cubin has no line info)."""
    table = _table_of(cubin).get(function) if cubin else None
    if table is None:
        return [None] * len(pcs)
    offsets, where = table
    i = np.searchsorted(offsets, np.asarray(pcs, np.int64), side="right") - 1
    return [where[j] if j >= 0 else None for j in i]
