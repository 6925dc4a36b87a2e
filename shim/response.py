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

from shim.flow import Pause
from shim.framing import MAX_HEAD, NO_BODY_STATUS, BadMessage
from shim.states import Ev, Req, Resp
from shim.upstream import ClientState, Upstream

log = logging.getLogger(__name__)

_CRLF2 = b"\r\n\r\n"


class ResponseSide(ClientState):
    """The response half of `shim.splice.Connection`: frame, pass on, hijack, upstream EOFs."""

    def up_data(self, up: Upstream, data: bytes) -> None:
        if up is not self.up:
            return
        ct = self.ct
        assert ct is not None  # the client connected before its upstream did
        state = self.resp.state
        if state is Resp.RAW:
            ct.write(data)
            return
        self.ubuf = self.ubuf + data if self.ubuf else data
        if state is Resp.COLLECTING:
            self.collect()
            return
        try:
            self._respond()
        except BadMessage as e:
            log.warning("closing connection: %s", e)
            self.close(abort=True)
        except Exception:
            log.exception("proxy error")
            self.close(abort=True)

    def _respond(self) -> None:
        ct = self.ct
        assert ct is not None
        p = self.rparser
        while self.ubuf:
            ubuf = self.ubuf
            state = self.resp.state
            if state is Resp.BODY:
                end = p.body(ubuf, 0)
                ct.write(ubuf if end == len(ubuf) else memoryview(ubuf)[:end])
                self.ubuf = ubuf[end:]
                if p.done:
                    self._response_done(p.keep_alive)
                return
            if state is Resp.UNTIL_CLOSE:
                ct.write(ubuf)
                self.ubuf = b""
                return
            if state is not Resp.HEAD:
                raise BadMessage(f"the Engine sent {len(ubuf)} bytes nobody asked for")
            end = ubuf.find(_CRLF2)
            if end < 0:
                if len(ubuf) > MAX_HEAD:
                    raise BadMessage("response header section too large")
                return
            end += 4
            if not p.head(ubuf, end):
                self.ubuf = ubuf[end:]
                continue
            status = p.status
            self.rsent = True
            if 100 <= status < 200 and status != 101:  # interim (100 Continue): pass it on
                ct.write(memoryview(ubuf)[:end])
                self.ubuf = ubuf[end:]
                continue
            framing = p.framing
            if (
                status == 101
                or p.upgraded
                or (
                    status == 200
                    and framing.raw_type
                    and framing.length is None
                    and not framing.chunked
                )
            ):
                ct.write(ubuf)
                self.ubuf = b""
                self._hijack()
                return
            if self.head_req or status in NO_BODY_STATUS:
                if self.head_req:
                    p.skip_body()
                ct.write(memoryview(ubuf)[:end] if end < len(ubuf) else ubuf)
                self.ubuf = ubuf[end:]
                self._response_done(p.keep_alive)
                return
            if not framing.chunked and framing.length is None:
                ct.write(ubuf)  # delimited by the Engine closing the connection
                self.ubuf = b""
                self.resp.fire(Ev.UNTIL_CLOSE)
                return
            pos = p.body(ubuf, end)
            ct.write(ubuf if pos == len(ubuf) else memoryview(ubuf)[:pos])
            self.ubuf = ubuf[pos:]
            if p.done:
                self._response_done(p.keep_alive)
                return
            self.resp.fire(Ev.BODY)

    def _response_done(self, keep: bool) -> None:
        self.resp.fire(Ev.RESPONSE_END)
        self.awaiting = False
        if self.ubuf:
            log.warning("the Engine sent %d bytes after a response", len(self.ubuf))
            keep = False
        if not (keep and self.req_keep) or self.eof_sent:
            self.close()
            return
        if self.req.state is Req.SENT:
            self.req.fire(Ev.RESPONSE_END)
            if self.flow.paused:
                self.flow.resume_client(Pause.AHEAD)
            if self.buf or self.client_eof:
                self.advance()

    def _hijack(self) -> None:
        """From now on both directions are raw byte pipes; EOFs pass on as write-EOFs."""
        self.req.fire(Ev.HIJACK)
        self.resp.fire(Ev.HIJACK)
        ut = self.ut
        assert ut is not None
        if self.buf:
            ut.write(self.buf)
            self.buf = b""
        if self.client_eof and not self.eof_sent:
            self.eof_sent = True
            ut.write_eof()
        self.flow.resume_client(Pause.AHEAD)

    def up_eof(self, up: Upstream) -> bool:
        if up is not self.up:
            return False
        if self.resp.state is Resp.RAW:
            if self.ct is not None and not self.ct.is_closing():
                self.ct.write_eof()
            if self.client_eof:
                self.close()
            return True
        self._up_gone()
        return False

    def up_lost(self, up: Upstream) -> None:
        if up is not self.up:
            return
        if self.resp.state is Resp.RAW:
            self.close()
        elif not up.eof:
            self._up_gone()

    def _up_gone(self) -> None:
        """The Engine closed our upstream connection (outside a hijack)."""
        state = self.resp.state
        if state is Resp.COLLECTING:
            self.collect(eof=True)
            return
        if state is Resp.UNTIL_CLOSE:
            self.close()
        elif state is Resp.HEAD and not self.rsent:
            log.error("the Engine closed the connection before answering")
            self.reply_error(502, "gpu-alloc shim: the Engine closed the connection")
        elif state is not Resp.IDLE or self.req.state is Req.STREAMING:
            self.close()  # a truncated exchange: the client must see the connection end
        else:
            self.drop_upstream()  # idle: reconnect for the next request
