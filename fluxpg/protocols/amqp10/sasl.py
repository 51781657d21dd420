"""AMQP 1.0 SASL (spec part 5.3), server side, sans-I/O.

The PyPI build of python-qpid-proton has no Cyrus SASL: as a server it can only offer ANONYMOUS.
So fluxpg runs its own small SASL layer in front of a proton transport that is created without
SASL: this module exchanges the SASL header and frames with the client, the connection checks the
credentials (asynchronously, through the broker's authenticator), and once the outcome is `ok` the
bytes that follow (the plain AMQP header `AMQP\\x00\\x01\\x00\\x00`, then AMQP frames) go to proton.

Frames are encoded and decoded with proton's `Data` codec (described lists). Supported mechanisms:
PLAIN (RFC 4616: `authzid NUL authcid NUL passwd`, with or without an initial response) and
ANONYMOUS (RFC 4505; the trace string is ignored).

    sasl = SaslServer(["PLAIN", "ANONYMOUS"])
    out = sasl.start()                 # our SASL header + sasl-mechanisms
    for event in sasl.receive(data):   # SaslInit(...) once the client picked a mechanism
        ...
    out = sasl.outcome(SaslCode.OK)    # then sasl.take_rest(): the bytes meant for proton
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from proton import Data, Described, symbol, ubyte, ulong

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"

FRAME_TYPE_SASL = 0x01
# Descriptor codes of the SASL performatives (amqp:sasl-*:list)
SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_CHALLENGE = 0x42
SASL_RESPONSE = 0x43
SASL_OUTCOME = 0x44

# Every SASL frame we accept is small: the spec guarantees 512 bytes; PLAIN with long names and
# passwords stays well under this. A bigger size is a broken or hostile peer.
MAX_SASL_FRAME = 16 * 1024


class SaslCode(enum.IntEnum):
    OK = 0
    AUTH = 1       # authentication failed: bad credentials
    SYS = 2        # system error
    SYS_PERM = 3   # unrecoverable system error
    SYS_TEMP = 4   # transient system error


class SaslError(Exception):
    """The client broke the SASL exchange (bad header, malformed frame): close the socket."""


@dataclass(frozen=True)
class SaslInit:
    """The client chose a mechanism. For PLAIN, `username`/`password` are filled in (or `response`
    is None when the client sent no initial response and we must ask for one)."""

    mechanism: str
    response: bytes | None
    hostname: str | None
    username: str | None = None
    password: str | None = None
    authzid: str | None = None


def encode_frame(descriptor: int, fields: list) -> bytes:
    """One SASL frame: 8-byte frame header (size, doff=2, type=1, channel=0) + described list."""
    data = Data()
    data.put_object(Described(ulong(descriptor), fields))
    body = bytes(data.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, FRAME_TYPE_SASL, 0) + body


def mechanisms_frame(mechanisms: list[str]) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(SASL_MECHANISMS)
    data.put_list()
    data.enter()
    # sasl-server-mechanisms is `symbol multiple`: always an array, even of one.
    data.put_array(False, Data.SYMBOL)
    data.enter()
    for mech in mechanisms:
        data.put_symbol(symbol(mech))
    data.exit()
    data.exit()
    data.exit()
    body = bytes(data.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, FRAME_TYPE_SASL, 0) + body


def outcome_frame(code: SaslCode) -> bytes:
    return encode_frame(SASL_OUTCOME, [ubyte(int(code))])


def challenge_frame(challenge: bytes = b"") -> bytes:
    return encode_frame(SASL_CHALLENGE, [challenge])


def decode_frame(frame: bytes) -> tuple[int, list]:
    """A complete SASL frame → (descriptor code, fields). Raises SaslError."""
    size, doff, ftype, _channel = struct.unpack_from(">IBBH", frame)
    if ftype != FRAME_TYPE_SASL:
        raise SaslError(f"expected a SASL frame (type 1), got frame type {ftype}")
    if doff < 2 or doff * 4 > size:
        raise SaslError(f"invalid data offset {doff} in a SASL frame of {size} bytes")
    body = frame[doff * 4 : size]
    data = Data()
    try:
        consumed = data.decode(body)
        data.rewind()
        data.next()
        value = data.get_object()
    except Exception as exc:  # noqa: BLE001 - proton raises DataException and others
        raise SaslError(f"malformed SASL frame: {exc}") from None
    if consumed != len(body):
        raise SaslError("trailing bytes after the SASL performative")
    if not isinstance(value, Described) or not isinstance(value.value, list):
        raise SaslError("a SASL frame must hold a described list")
    descriptor = value.descriptor
    if isinstance(descriptor, symbol):
        names = {"amqp:sasl-init:list": SASL_INIT, "amqp:sasl-response:list": SASL_RESPONSE}
        code = names.get(str(descriptor))
        if code is None:
            raise SaslError(f"unexpected SASL performative {descriptor}")
        descriptor = code
    # Copy binary fields now: proton hands out memoryviews into the Data, freed with it.
    fields = [bytes(f) if isinstance(f, memoryview) else f for f in value.value]
    return int(descriptor), fields


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _binary(value) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise SaslError(f"expected binary SASL data, got {type(value).__name__}")


def parse_plain(response: bytes) -> tuple[str, str, str]:
    """RFC 4616 message → (authzid, username, password). Raises SaslError when malformed."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise SaslError("malformed PLAIN response: expected authzid NUL username NUL password")
    try:
        authzid, username, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise SaslError("malformed PLAIN response: not UTF-8") from None
    return authzid, username, password


class _State(enum.Enum):
    HEADER = "header"      # waiting for the client's SASL protocol header
    INIT = "init"          # mechanisms sent, waiting for sasl-init
    RESPONSE = "response"  # empty challenge sent (PLAIN without initial response)
    DECIDING = "deciding"  # credentials handed to the caller, waiting for outcome()
    DONE = "done"          # outcome ok: later bytes belong to AMQP
    FAILED = "failed"


class SaslServer:
    """The server side of the SASL exchange. Feed it bytes with `receive`; it returns SaslInit
    once the credentials are known; answer with `outcome(...)`. Output bytes come back from
    `start`, `receive` (via `take_output`) and `outcome`."""

    def __init__(self, mechanisms: list[str]):
        if not mechanisms:
            raise ValueError("at least one SASL mechanism must be offered")
        self.mechanisms = [m.upper() for m in mechanisms]
        self._state = _State.HEADER
        self._buffer = bytearray()
        self._out = bytearray()
        self._init: SaslInit | None = None

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def failed(self) -> bool:
        return self._state is _State.FAILED

    def take_output(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def take_rest(self) -> bytes:
        """After a successful outcome: the bytes received beyond the SASL exchange (the client may
        pipeline its AMQP header and open); they belong to the AMQP layer."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def receive(self, data: bytes) -> list[SaslInit]:
        """Consume bytes from the client. Returns the SaslInit when credentials are complete
        (at most once). Raises SaslError on a protocol violation (close the connection)."""
        self._buffer += data
        events: list[SaslInit] = []
        while True:
            if self._state is _State.HEADER:
                if len(self._buffer) < 8:
                    return events
                header = bytes(self._buffer[:8])
                del self._buffer[:8]
                if header != SASL_HEADER:
                    self._state = _State.FAILED
                    raise SaslError(f"expected the AMQP SASL header, got {header!r}")
                self._out += SASL_HEADER + mechanisms_frame(self.mechanisms)
                self._state = _State.INIT
                continue
            if self._state in (_State.INIT, _State.RESPONSE):
                frame = self._next_frame()
                if frame is None:
                    return events
                if frame == b"":
                    continue  # an empty (heartbeat) frame
                code, fields = decode_frame(frame)
                event = self._on_frame(code, fields)
                if event is not None:
                    events.append(event)
                continue
            # DECIDING / DONE / FAILED: keep the bytes for whoever comes next.
            return events

    def _next_frame(self) -> bytes | None:
        if len(self._buffer) < 8:
            return None
        size = struct.unpack_from(">I", self._buffer)[0]
        if size < 8 or size > MAX_SASL_FRAME:
            self._state = _State.FAILED
            raise SaslError(f"invalid SASL frame size {size}")
        if len(self._buffer) < size:
            return None
        frame = bytes(self._buffer[:size])
        del self._buffer[:size]
        if size == 8:
            return b""
        return frame

    def _on_frame(self, code: int, fields: list) -> SaslInit | None:
        fields = fields + [None] * 3
        if self._state is _State.INIT:
            if code != SASL_INIT:
                self._state = _State.FAILED
                raise SaslError(f"expected sasl-init, got performative 0x{code:02x}")
            mechanism = _text(fields[0])
            if not mechanism:
                self._state = _State.FAILED
                raise SaslError("sasl-init without a mechanism")
            mechanism = mechanism.upper()
            response = _binary(fields[1])
            hostname = _text(fields[2])
            if mechanism not in self.mechanisms:
                # Not a protocol violation: tell the client "auth failed" through the outcome.
                self._init = SaslInit(mechanism, response, hostname)
                self._state = _State.DECIDING
                return self._init
            if mechanism == "PLAIN" and response is None:
                # RFC 4422: the server sends an empty challenge and waits for the response.
                self._init = SaslInit(mechanism, None, hostname)
                self._out += challenge_frame(b"")
                self._state = _State.RESPONSE
                return None
            return self._decide(SaslInit(mechanism, response, hostname))
        # RESPONSE
        if code != SASL_RESPONSE:
            self._state = _State.FAILED
            raise SaslError(f"expected sasl-response, got performative 0x{code:02x}")
        assert self._init is not None
        return self._decide(SaslInit(self._init.mechanism, _binary(fields[0]) or b"", self._init.hostname))

    def _decide(self, init: SaslInit) -> SaslInit:
        if init.mechanism == "PLAIN":
            authzid, username, password = parse_plain(init.response or b"")
            init = SaslInit(init.mechanism, None, init.hostname, username=username, password=password,
                            authzid=authzid or None)
        self._init = init
        self._state = _State.DECIDING
        return init

    def outcome(self, code: SaslCode) -> bytes:
        """Answer the client's sasl-init; the returned bytes must be sent. After OK the exchange is
        done and the client's next bytes must be the AMQP header (proton checks it)."""
        if self._state is not _State.DECIDING:
            raise RuntimeError(f"sasl outcome in state {self._state.value}")
        self._state = _State.DONE if code == SaslCode.OK else _State.FAILED
        return outcome_frame(code)


def client_frames(mechanism: str, username: str | None = None, password: str | None = None,
                  hostname: str | None = None) -> bytes:
    """A client's SASL header + sasl-init (tests and tools: proton's PyPI client has its own)."""
    if mechanism.upper() == "PLAIN":
        response = f"\x00{username or ''}\x00{password or ''}".encode()
    else:
        response = b""
    return SASL_HEADER + encode_frame(SASL_INIT, [symbol(mechanism.upper()), response, hostname])
