"""An incremental decoder of HTTP/1.1 chunked framing, fed bytes exactly as they come off the socket.

The proxy forwards each read to the client untouched and only needs to know
two things from it: the payload (for the session meter) and where the body
ends. Decoding from whatever the socket gave, instead of awaiting each size
line and each chunk, costs one event-loop wake-up per read rather than three
per chunk: that is most of the proxy's per-request cost on a streamed answer.
"""

from __future__ import annotations

_MAX_SIZE_LINE = 1024


class ChunkedError(ValueError):
    """The bytes are not valid chunked framing."""


class ChunkedDecoder:
    def __init__(self) -> None:
        self._line = bytearray()  # a size line (or trailer line) not yet complete
        self._left = 0  # payload bytes still due in the current chunk
        self._crlf = 0  # CRLF bytes still due after the current chunk's payload
        self._trailer = False  # past the last (zero) chunk, reading trailer lines
        self.done = False

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """(payload found in `data`, bytes of `data` consumed); consumed < len(data) only once done."""
        payload = bytearray()
        i, n = 0, len(data)
        while i < n and not self.done:
            if self._left:
                take = min(self._left, n - i)
                payload += data[i : i + take]
                self._left -= take
                i += take
                if not self._left:
                    self._crlf = 2
            elif self._crlf:
                take = min(self._crlf, n - i)
                if data[i : i + take] != b"\r\n"[2 - self._crlf : 2 - self._crlf + take]:
                    raise ChunkedError("chunk not followed by CRLF")
                self._crlf -= take
                i += take
            else:
                end = data.find(b"\n", i)
                stop = n if end < 0 else end + 1
                self._line += data[i:stop]
                i = stop
                if len(self._line) > _MAX_SIZE_LINE:
                    raise ChunkedError("chunk size line too long")
                if end >= 0:
                    self._end_line(bytes(self._line))
                    self._line.clear()
        return bytes(payload), i

    def _end_line(self, line: bytes) -> None:
        if self._trailer:
            if line in (b"\r\n", b"\n"):
                self.done = True
            return
        text = line.split(b";", 1)[0].strip()
        if not text or text.strip(b"0123456789abcdefABCDEF"):
            raise ChunkedError(f"bad chunk size {text[:20]!r}")
        size = int(text, 16)
        if size == 0:
            self._trailer = True
        else:
            self._left = size
