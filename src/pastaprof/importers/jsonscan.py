"""An exact, streaming scan of JSON structure: where strings are, how deep each bracket is.

Finding a trace's ``traceEvents`` array (and the ``]`` that closes it) needs the real
structure of the file: names hold brackets (``aten::index[...]``), strings hold escaped
quotes, and other top-level arrays (Kineto's ``"INFO"`` log, ``deviceProperties``,
``samples``) may come before or after it.  Guessing from the end of the file picks the
wrong ``]``; parsing the whole file as objects would hold gigabytes in memory.

Two scanners with the same rules (a quote preceded by an odd run of backslashes does not
open or close a string; a bracket counts only outside strings):

* ``Scanner`` gives positions: every real quote, every bracket outside strings and the
  depth after it.  One NumPy pass per block; used on the metadata before the array
  and on the one piece (``EXACT_PIECE`` bytes) where the array ends.
* ``ArrayEnd`` only follows the depth until the array closes.  Per block it drops
  escaped backslashes and quotes (``bytes.replace``), keeps only quotes and brackets
  (``bytes.translate``), drops empty strings (``""``, which changes no parity), and
  sums the depth of what is left with NumPy: C-speed byte passes, no Python step per
  byte or token.

Between blocks only the state is kept (inside a string or not, the depth).  Neither
validates JSON: the event array they delimit is parsed by DuckDB and the metadata
around it by orjson, which reject what is not JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUOTE, BACKSLASH = 0x22, 0x5C
_OPEN, _CLOSE = 0x7B, 0x7D  # '{' '}'; '[' and ']' map onto them with | 0x20


@dataclass
class Block:
    """The structure of one scanned block: positions are relative to the block."""

    quotes: np.ndarray      # positions of the quotes that open or close a string
    brackets: np.ndarray    # positions of the brackets outside strings
    depth: np.ndarray       # the depth just after each of those brackets


class Scanner:
    """Carries the string / escape / depth state of a JSON text across blocks."""

    def __init__(self, depth: int = 0, in_string: bool = False) -> None:
        self.depth = depth
        self.in_string = in_string
        self.odd_backslashes = False  # the previous block ended on an odd run of backslashes

    def scan(self, data: bytes | bytearray) -> Block:
        """Scan the next block and advance the state past it."""
        a = np.frombuffer(data, dtype=np.uint8)
        n = len(a)
        if n == 0:
            empty = np.zeros(0, np.int64)
            return Block(empty, empty, empty)
        carry = self.odd_backslashes
        quotes = np.flatnonzero(a == QUOTE)
        has_bs = carry or data.find(b"\\") >= 0
        if has_bs:
            quotes = _unescaped(a, quotes, carry)
        folded = a | 0x20
        opens = folded == _OPEN
        closes = folded == _CLOSE
        br = np.flatnonzero(opens | closes)
        # A bracket is inside a string iff an odd number of real quotes precede it.
        before = np.searchsorted(quotes, br)
        br = br[(before + int(self.in_string)) % 2 == 0]
        depth = self.depth + np.cumsum(np.where(closes[br], -1, 1).astype(np.int64))
        self.in_string = bool((int(self.in_string) + len(quotes)) % 2)
        if len(depth):
            self.depth = int(depth[-1])
        run = _trailing_run(data) if has_bs else 0
        self.odd_backslashes = (run + (int(carry) if run == n else 0)) % 2 == 1
        return Block(quotes, br, depth)


def _unescaped(a: np.ndarray, quotes: np.ndarray, carry: bool) -> np.ndarray:
    """The quotes not preceded by an odd run of backslashes (``carry``: the block
    begins inside a run that had an odd length so far)."""
    if len(quotes) == 0:
        return quotes
    bs = np.flatnonzero(a == BACKSLASH)
    run = np.zeros(len(quotes), dtype=np.int64)
    if len(bs):
        starts = bs[np.r_[True, bs[1:] != bs[:-1] + 1]]  # first backslash of each run
        prev = quotes - 1
        after = np.zeros(len(quotes), dtype=bool)
        ok = prev >= 0
        after[ok] = a[prev[ok]] == BACKSLASH
        idx = np.flatnonzero(after)
        if len(idx):
            s = starts[np.searchsorted(starts, prev[idx], side="right") - 1]
            run[idx] = quotes[idx] - s + np.where(s == 0, int(carry), 0)
    if carry and quotes[0] == 0:
        run[0] = 1
    return quotes[run % 2 == 0]


def _trailing_run(data: bytes | bytearray) -> int:
    """Length of the run of backslashes that ends the block (runs are short)."""
    n = len(data)
    i = n
    while i > 0 and data[i - 1] == BACKSLASH:
        i -= 1
    return n - i


_KEEP = frozenset(b'"[]{}')
_DELETE = bytes(c for c in range(256) if c not in _KEEP)
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[0x5B, 0x7B]] = 1
_DELTA[[0x5D, 0x7D]] = -1


EXACT_PIECE = 1 << 18  # the block where the array closes is re-scanned in pieces this size


class ArrayEnd:
    """Finds the bracket that closes an array whose opening bracket was already seen.

    ``feed`` takes the bytes after the opening bracket block by block and returns the
    offset (in the whole fed stream) of the closing bracket, or -1 while not seen.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth          # containers open right after the opening bracket
        self.target = depth - 1     # the depth once it is closed
        self.in_string = False
        self.offset = 0             # stream offset of ``pending``'s first byte
        self.pending = b""          # a trailing run of backslashes, scanned with the next block

    def feed(self, block: bytes | bytearray) -> int:
        data = self.pending + bytes(block) if self.pending else bytes(block)
        run = _trailing_run(data)
        self.pending = data[len(data) - run:] if run else b""
        data = data[: len(data) - run] if run else data
        step = EXACT_PIECE
        start = self.offset
        if self._fast(data):  # narrow it down to one piece, scanned exactly
            for lo in range(0, len(data), step):
                piece = data[lo : lo + step]
                if _trailing_run(piece) or self._fast(piece):
                    piece = data[lo:]  # a piece must not end inside a run of backslashes
                    return start + lo + self._exact(piece)
        self.offset += len(data)
        return -1

    def finish(self) -> int:
        """Scan what is still held back at the end of the stream (-1: never closed)."""
        data, self.pending = self.pending, b""
        return self.offset + self._exact(data) if data and self._fast(data) else -1

    def _fast(self, data: bytes) -> bool:
        """Advance the state over ``data``; True (state unchanged) if the array closes in it."""
        d = data
        if b"\\" in d:
            d = d.replace(b"\\\\", b"").replace(b'\\"', b"")
        c = d.translate(None, _DELETE).replace(b'""', b"")
        a = np.frombuffer(c, dtype=np.uint8)
        if len(a) == 0:
            return False
        quote = a == QUOTE
        delta = _DELTA[a]
        nq = int(np.count_nonzero(quote))
        if nq or self.in_string:  # parity of the quotes so far (uint8 wraps, its low bit does not)
            inside = np.add.accumulate(quote.view(np.uint8), dtype=np.uint8) + np.uint8(self.in_string)
            delta[(inside & 1).view(bool)] = 0
        depth = np.add.accumulate(delta, dtype=np.int64 if len(a) >= 1 << 31 else np.int32)
        if int(depth.min()) + self.depth <= self.target:
            return True
        self.depth += int(depth[-1])
        self.in_string = bool((nq + int(self.in_string)) % 2)
        return False

    def _exact(self, data: bytes) -> int:
        sc = Scanner(self.depth, self.in_string)
        blk = sc.scan(data)
        hit = np.flatnonzero(blk.depth <= self.target)
        return int(blk.brackets[hit[0]])
