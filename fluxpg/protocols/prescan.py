"""Cheap pre-scans of encoded structures, run BEFORE the real decoders (pamqp, proton) see them.

Why: the decoders build Python/C objects for every element they meet, and the encodings let a
tiny input announce a huge number of elements. An AMQP 1.0 array of `null`/`true`/`uint0`
elements (zero-width constructors 0x40–0x45) costs 0 bytes per element, so a 13-byte array32
announces four billion values: proton decoded a 97-byte message for ~0.18 s of the event loop
(such arrays may hold no more elements than the input has bytes).
AMQP 0-9-1 field tables/arrays nest without limit. The scans below only walk lengths and
constructor bytes — no objects, O(input) time with no amplification — and refuse an input whose
nesting is deeper than `max_depth` or that holds more than `max_elements` values in total
(config `bounds.decoder_max_depth` / `bounds.decoder_max_elements`).

They also refuse structurally broken encodings (a length past the end), which the decoders
would refuse anyway. Pure functions, no I/O; `DecodeLimitError` (a ValueError) is the only
exception that leaves them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from pamqp import commands

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class DecodeLimitError(ValueError):
    """The input exceeds a decoder bound or is not well-formed; the message says which."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int = 16
    max_elements: int = 10_000

    @classmethod
    def from_config(cls, config) -> Limits:
        bounds = getattr(config, "bounds", None)
        if bounds is None:
            return cls()
        return cls(bounds.decoder_max_depth, bounds.decoder_max_elements)


DEFAULT_LIMITS = Limits()


class _Budget:
    __slots__ = ("input_size", "left", "limits")

    def __init__(self, limits: Limits, input_size: int = 0):
        self.limits = limits
        self.left = limits.max_elements
        self.input_size = input_size

    def take(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise DecodeLimitError(f"more than {self.limits.max_elements} elements in one structure "
                                   "(bounds.decoder_max_elements)")

    def depth(self, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise DecodeLimitError(f"structure nested deeper than {self.limits.max_depth} levels "
                                   "(bounds.decoder_max_depth)")


def _need(data, pos: int, n: int, end: int) -> None:
    if n < 0 or pos + n > end:
        raise DecodeLimitError("a length runs past the end of its data")


# --------------------------------------------------------------------------- AMQP 0-9-1

# Field value type tag → fixed size in bytes (None: variable, handled below).
_AMQP091_FIXED = {
    b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"l": 8, b"L": 8, b"f": 4, b"d": 8,
    b"D": 5, b"T": 8, b"V": 0, b"\x00": 0,
}


def _amqp091_value(data, pos: int, end: int, depth: int, budget: _Budget) -> int:
    _need(data, pos, 1, end)
    tag = data[pos:pos + 1]
    pos += 1
    budget.take()
    size = _AMQP091_FIXED.get(tag)
    if size is not None:
        _need(data, pos, size, end)
        return pos + size
    if tag in (b"S", b"x"):
        _need(data, pos, 4, end)
        n = _U32.unpack_from(data, pos)[0]
        _need(data, pos + 4, n, end)
        return pos + 4 + n
    if tag == b"F":
        return _amqp091_table(data, pos, end, depth + 1, budget)
    if tag == b"A":
        budget.depth(depth + 1)
        _need(data, pos, 4, end)
        n = _U32.unpack_from(data, pos)[0]
        pos += 4
        stop = pos + n
        _need(data, pos, n, end)
        while pos < stop:
            pos = _amqp091_value(data, pos, stop, depth + 1, budget)
        return stop
    raise DecodeLimitError(f"unknown field value type {tag!r}")


def _amqp091_table(data, pos: int, end: int, depth: int, budget: _Budget) -> int:
    budget.depth(depth)
    _need(data, pos, 4, end)
    n = _U32.unpack_from(data, pos)[0]
    pos += 4
    _need(data, pos, n, end)
    stop = pos + n
    while pos < stop:
        klen = data[pos]
        pos += 1 + klen
        if pos > stop:
            raise DecodeLimitError("a field table key runs past the end of its table")
        pos = _amqp091_value(data, pos, stop, depth, budget)
    return stop


def amqp091_table(data: bytes, pos: int = 0, limits: Limits = DEFAULT_LIMITS) -> int:
    """Scan a field table at `pos`; its end offset."""
    return _amqp091_table(data, pos, len(data), 1, _Budget(limits))


# pamqp argument type → fixed size (tables and strings are walked; bits are packed).
_ARG_FIXED = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}


def amqp091_method(payload: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Scan a method frame's payload (class id, method id, arguments): every field table in it
    (connection.start-ok client properties, queue.declare / basic.consume arguments, …)."""
    if len(payload) < 4:
        return   # the decoder reports it
    cls = commands.INDEX_MAPPING.get(_U32.unpack_from(payload, 0)[0])
    if cls is None:
        return   # unknown method: the decoder reports it
    budget = _Budget(limits)
    data, pos, end = payload, 4, len(payload)
    in_bits = False
    for name in cls.__slots__:
        kind = cls.amqp_type(name)
        if kind == "bit":
            if not in_bits:
                _need(data, pos, 1, end)
                pos += 1
                in_bits = True
            continue   # (more than 8 consecutive bits do not occur in 0-9-1 methods)
        in_bits = False
        if kind in _ARG_FIXED:
            _need(data, pos, _ARG_FIXED[kind], end)
            pos += _ARG_FIXED[kind]
        elif kind == "shortstr":
            _need(data, pos, 1, end)
            pos += 1 + data[pos]
        elif kind == "longstr":
            _need(data, pos, 4, end)
            pos += 4 + _U32.unpack_from(data, pos)[0]
        elif kind == "table":
            pos = _amqp091_table(data, pos, end, 1, budget)
        else:
            return   # a type this scan does not know: leave it to the decoder
        if pos > end:
            raise DecodeLimitError(f"{cls.name}: an argument runs past the end of the frame")


# Basic properties in flag order (bit 15 first) with their encoding.
_BASIC_PROPERTIES = ("shortstr", "shortstr", "table", "octet", "octet", "shortstr", "shortstr", "shortstr",
                     "shortstr", "timestamp", "shortstr", "shortstr", "shortstr", "shortstr")


def amqp091_content_header(payload: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Scan a content header frame's payload: the `headers` table of the basic properties."""
    end = len(payload)
    if end < 14:
        return   # the decoder reports it
    flags = _U16.unpack_from(payload, 12)[0]
    if not flags & (1 << 13):
        return   # no headers table
    pos = 14
    while flags & 1:   # continuation flag words (none defined for basic, but legal)
        _need(payload, pos, 2, end)
        flags = _U16.unpack_from(payload, pos)[0]
        pos += 2
    flags = _U16.unpack_from(payload, 12)[0]
    for bit in (15, 14):
        if flags & (1 << bit):
            _need(payload, pos, 1, end)
            pos += 1 + payload[pos]
    _amqp091_table(payload, pos, end, 1, _Budget(limits))


def amqp091_frame(ftype: int, payload: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Scan a method (type 1) or content header (type 2) frame; other frames have no tables."""
    if ftype == 1:
        amqp091_method(payload, limits)
    elif ftype == 2:
        amqp091_content_header(payload, limits)


# --------------------------------------------------------------------------- AMQP 1.0


def _amqp10_width(code: int) -> int | None:
    """Bytes after a fixed-width constructor, None for variable/compound/array ones."""
    high = code & 0xF0
    return {0x40: 0, 0x50: 1, 0x60: 2, 0x70: 4, 0x80: 8, 0x90: 16}.get(high)


def _amqp10_constructor(data, pos: int, end: int, depth: int, budget: _Budget) -> tuple[int, int]:
    """(format code, position after the constructor); a described constructor's descriptor is
    scanned as a value."""
    _need(data, pos, 1, end)
    code = data[pos]
    pos += 1
    # A described value may itself be described (an amqp-value section holding a transaction
    # declare is 0x00 <section> 0x00 <declare> <list>): each level counts toward the depth bound.
    while code == 0x00:
        depth += 1
        budget.depth(depth)
        pos = _amqp10_value(data, pos, end, depth, budget)   # the descriptor
        _need(data, pos, 1, end)
        code = data[pos]
        pos += 1
    return code, pos


def _amqp10_body(code: int, data, pos: int, end: int, depth: int, budget: _Budget) -> int:
    """Scan the bytes of one value whose constructor was `code`; the position after it."""
    width = _amqp10_width(code)
    if width is not None:
        _need(data, pos, width, end)
        return pos + width
    high = code & 0xF0
    if high in (0xA0, 0xC0, 0xE0):
        _need(data, pos, 1, end)
        size, hdr = data[pos], 1
    elif high in (0xB0, 0xD0, 0xF0):
        _need(data, pos, 4, end)
        size, hdr = _U32.unpack_from(data, pos)[0], 4
    else:
        raise DecodeLimitError(f"unknown AMQP 1.0 format code 0x{code:02x}")
    pos += hdr
    _need(data, pos, size, end)
    stop = pos + size
    if high in (0xA0, 0xB0):
        return stop   # binary / string / symbol
    budget.depth(depth + 1)
    _need(data, pos, hdr, stop)
    count = data[pos] if hdr == 1 else _U32.unpack_from(data, pos)[0]
    pos += hdr
    if high in (0xC0, 0xD0):   # list / map
        budget.take(count)
        for _ in range(count):
            pos = _amqp10_value(data, pos, stop, depth + 1, budget, counted=True)
        return stop
    # array: one constructor, then `count` bodies without constructors
    budget.take(count)   # before anything else: zero-width elements cost nothing to announce
    elem, pos = _amqp10_constructor(data, pos, stop, depth + 1, budget)
    elem_width = _amqp10_width(elem)
    if elem_width == 0 and count > budget.input_size:
        # Every other element costs the sender at least a byte; these cost nothing, so their
        # number is bounded by the input's size too (decoding is then linear in the input).
        raise DecodeLimitError(f"array of {count} zero-width values in {budget.input_size} bytes")
    if elem_width is not None:
        _need(data, pos, count * elem_width, stop)
        return stop
    for _ in range(count):
        pos = _amqp10_body(elem, data, pos, stop, depth + 1, budget)
    return stop


def _amqp10_value(data, pos: int, end: int, depth: int, budget: _Budget, counted: bool = False) -> int:
    if not counted:
        budget.take()
    code, pos = _amqp10_constructor(data, pos, end, depth, budget)
    return _amqp10_body(code, data, pos, end, depth, budget)


def amqp10_values(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS, *,
                  start: int = 0, end: int | None = None, max_values: int | None = None) -> int:
    """Scan consecutive AMQP 1.0 encoded values (a message's sections, a performative) in
    data[start:end]; at most `max_values` of them (None: to the end). Returns the end offset."""
    end = len(data) if end is None else end
    budget = _Budget(limits, end - start)
    pos = start
    n = 0
    while pos < end and (max_values is None or n < max_values):
        pos = _amqp10_value(data, pos, end, 0, budget)
        n += 1
    return pos


def amqp10_message(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> int:
    """Scan a transfer's message bytes: a sequence of sections, each a described value (header,
    properties, application-properties, data, amqp-value, …). Anything else at the top level is
    not a message — and a thousand bare one-byte values would cost proton a thousand section
    decodes. Returns the number of sections."""
    end = len(data)
    budget = _Budget(limits, end)
    pos = 0
    n = 0
    while pos < end:
        if data[pos] != 0x00:
            raise DecodeLimitError(f"byte {pos} of the message starts no section (format code "
                                   f"0x{data[pos]:02x}; a section is a described value)")
        pos = _amqp10_value(data, pos, end, 0, budget)
        n += 1
    return n


__all__ = ["DEFAULT_LIMITS", "DecodeLimitError", "Limits", "amqp091_content_header", "amqp091_frame",
           "amqp091_method", "amqp091_table", "amqp10_message", "amqp10_values"]
