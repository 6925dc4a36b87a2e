"""The response half of a spliced exchange: the Engine's bytes, back to the client.

A response the interceptor did not ask for is framed only as far as the splice needs:
where it ends (length, chunks, or the Engine closing), so the next pipelined request
starts in the right place and the bytes are passed on unchanged, as they arrive.  A
hijack (`101 UPGRADED`, or the legacy `200 OK` raw stream with no length) turns the
connection into two raw pipes here; an upstream EOF or close ends, truncates or just
drops the exchange, as its state says.  Like shim/splice.py, this runs inside the
upstream protocol's callbacks, with no task switch.
"""

from __future__ import annotations

import logging

from shim.framing import (
    _CRLF2,
    _NO_BODY_STATUS,
    MAX_HEAD,
    _BadMessage,
    _Body,
    _Framing,
    _keep_alive,
    _parse_response,
    quick_response,
)
from shim.upstream import (
    _P_AHEAD,
    _RQ_BODY,
    _RQ_HEAD,
    _RQ_SENT,
    _RS_BODY,
    _RS_COLLECT,
    _RS_HEAD,
    _RS_IDLE,
    _RS_UNTIL_CLOSE,
    ClientState,
    _Upstream,
)

log = logging.getLogger(__name__)


class ResponseSide(ClientState):
    """The response half of `shim.splice._Client`: frame, pass on, hijack, upstream EOFs."""

    def up_data(self, up: _Upstream, data: bytes) -> None:
        if up is not self.up:
            return
        ct = self.ct
        assert ct is not None  # the client connected before its upstream did
        if self.raw:
            ct.write(data)
            return
        if self.rs == _RS_HEAD and not self.ubuf and not self.head_req and quick_response(data):
            self.rsent = True
            ct.write(data)
            self._response_done(True)
            return
        self.ubuf = self.ubuf + data if self.ubuf else data
        if self.rs == _RS_COLLECT:
            self._collect()
            return
        try:
            self._respond()
        except _BadMessage as e:
            log.warning("closing connection: %s", e)
            self.close(abort=True)
        except Exception:
            log.exception("proxy error")
            self.close(abort=True)

    def _respond(self) -> None:
        ct = self.ct
        assert ct is not None
        while self.ubuf:
            ubuf = self.ubuf
            rs = self.rs
            if rs == _RS_BODY:
                body = self.rbody
                assert body is not None
                end = body.take(ubuf, 0)
                ct.write(ubuf if end == len(ubuf) else memoryview(ubuf)[:end])
                self.ubuf = ubuf[end:]
                if body.done:
                    self._response_done(self.rkeep)
                return
            if rs == _RS_UNTIL_CLOSE:
                ct.write(ubuf)
                self.ubuf = b""
                return
            if rs != _RS_HEAD:
                raise _BadMessage(f"the Engine sent {len(ubuf)} bytes nobody asked for")
            end = ubuf.find(_CRLF2)
            if end < 0:
                if len(ubuf) > MAX_HEAD:
                    raise _BadMessage("response header section too large")
                return
            end += 4
            parser, head = _parse_response(ubuf, end)
            status = parser.get_status_code() if parser is not None else 101
            self.rsent = True
            if 100 <= status < 200 and status != 101:  # interim (100 Continue): pass it on
                ct.write(memoryview(ubuf)[:end])
                self.ubuf = ubuf[end:]
                continue
            framing = _Framing(head.headers)
            if status == 101 or (
                status == 200
                and framing.raw_type
                and framing.length is None
                and not framing.chunked
            ):
                ct.write(ubuf)
                self.ubuf = b""
                self._hijack()
                return
            if self.head_req or status in _NO_BODY_STATUS:
                ct.write(memoryview(ubuf)[:end] if end < len(ubuf) else ubuf)
                self.ubuf = ubuf[end:]
                self._response_done(_keep_alive(ubuf, framing))
                return
            if not framing.chunked and framing.length is None:
                ct.write(ubuf)  # delimited by the Engine closing the connection
                self.ubuf = b""
                self.rs = _RS_UNTIL_CLOSE
                return
            body = _Body(parser, head, framing)
            pos = body.take(ubuf, end)
            ct.write(ubuf if pos == len(ubuf) else memoryview(ubuf)[:pos])
            self.ubuf = ubuf[pos:]
            if body.done:
                self._response_done(_keep_alive(ubuf, framing))
                return
            self.rbody = body
            self.rkeep = _keep_alive(ubuf, framing)
            self.rs = _RS_BODY

    def _response_done(self, keep: bool) -> None:
        self.rbody = None
        self.rs = _RS_IDLE
        self.awaiting = False
        if self.ubuf:
            log.warning("the Engine sent %d bytes after a response", len(self.ubuf))
            keep = False
        if not (keep and self.req_keep) or self.eof_sent:
            self.close()
            return
        if self.rq == _RQ_SENT:
            self.rq = _RQ_HEAD
            if self.cpause:
                self.resume_client(_P_AHEAD)
            if self.buf or self.client_eof:
                self.advance()

    def _hijack(self) -> None:
        """From now on both directions are raw byte pipes; EOFs pass on as write-EOFs."""
        self.raw = True
        self.rs = _RS_IDLE
        self.rq = _RQ_HEAD
        self.body = None
        ut = self.ut
        assert ut is not None
        if self.buf:
            ut.write(self.buf)
            self.buf = b""
        if self.client_eof and not self.eof_sent:
            self.eof_sent = True
            ut.write_eof()
        self.resume_client(_P_AHEAD)

    def up_eof(self, up: _Upstream) -> bool:
        if up is not self.up:
            return False
        if self.raw:
            if self.ct is not None and not self.ct.is_closing():
                self.ct.write_eof()
            if self.client_eof:
                self.close()
            return True
        self._up_gone()
        return False

    def up_lost(self, up: _Upstream) -> None:
        if up is not self.up:
            return
        if self.raw:
            self.close()
        elif not up.eof:
            self._up_gone()

    def _up_gone(self) -> None:
        """The Engine closed our upstream connection (outside a hijack)."""
        rs = self.rs
        if rs == _RS_COLLECT:
            self._collect(eof=True)
            return
        if rs == _RS_UNTIL_CLOSE:
            self.close()
        elif rs == _RS_HEAD and not self.rsent:
            log.error("the Engine closed the connection before answering")
            self.reply_error(502, "gpu-alloc shim: the Engine closed the connection")
        elif rs != _RS_IDLE or self.rq == _RQ_BODY:
            self.close()  # a truncated exchange: the client must see the connection end
        else:
            self.drop_upstream()  # idle: reconnect for the next request
