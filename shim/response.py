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
from typing import TYPE_CHECKING

from shim.flow import Pause
from shim.framing import BadMessage
from shim.headlimit import response_head_end
from shim.states import Act, Answer, Ev, Resp, answer

if TYPE_CHECKING:
    from shim.ports import Client
    from shim.upstream import Upstream

log = logging.getLogger(__name__)

# The members every answer reads, read once (see shim/splice.py).
HEAD, BODY, UNTIL_CLOSE, RAW, COLLECTING = (
    Resp.HEAD, Resp.BODY, Resp.UNTIL_CLOSE, Resp.RAW, Resp.COLLECTING,
)  # fmt: skip
CLOSE, GO_ON = Act.CLOSE, Act.GO_ON
INTERIM, HIJACK, NO_BODY, ENDS_AT_CLOSE = (
    Answer.INTERIM, Answer.HIJACK, Answer.NO_BODY, Answer.UNTIL_CLOSE,
)  # fmt: skip


class Relay:
    """What a connection's upstream hears: answers framed and passed on, hijacks, EOFs."""

    __slots__ = ("conn",)

    def __init__(self, conn: Client) -> None:
        self.conn = conn

    def data(self, up: Upstream, data: bytes) -> None:
        conn = self.conn
        link = conn.link
        if up is not link.up:
            return
        state = link.resp.state
        if state is RAW:
            assert conn.ct is not None  # the client connected before its upstream did
            conn.ct.write(data)
            return
        up.buf = up.buf + data if up.buf else data
        if state is COLLECTING:
            link.collect(up)
            return
        try:
            self._respond(up)
        except BadMessage as e:
            log.warning("closing connection: %s", e)
            conn.close(abort=True)
        except Exception:
            log.exception("proxy error")
            conn.close(abort=True)

    def _respond(self, up: Upstream) -> None:
        conn = self.conn
        ct = conn.ct
        resp = conn.link.resp
        exchange = conn.exchange
        assert ct is not None
        p = up.parser
        while up.buf:
            ubuf = up.buf
            state = resp.state
            if state is BODY:
                end = p.body(ubuf, 0)
                ct.write(ubuf if end == len(ubuf) else memoryview(ubuf)[:end])
                up.buf = ubuf[end:]
                if p.done:
                    self._response_done(up, p.keep_alive)
                return
            if state is UNTIL_CLOSE:
                ct.write(ubuf)
                up.buf = b""
                return
            if state is not HEAD:
                raise BadMessage(f"the Engine sent {len(ubuf)} bytes nobody asked for")
            assert exchange is not None  # a spliced request went upstream
            end = response_head_end(ubuf)
            if not end:
                return
            if not p.head(ubuf, end):
                up.buf = ubuf[end:]
                continue
            exchange.answered = True
            what = answer(p.status, p.upgraded, p.framing, exchange.head_req)
            if what is INTERIM:  # (100 Continue): pass it on
                ct.write(memoryview(ubuf)[:end])
                up.buf = ubuf[end:]
                continue
            if what is HIJACK:
                ct.write(ubuf)
                up.buf = b""
                self._hijack(up)
                return
            if what is NO_BODY:
                if exchange.head_req:
                    p.skip_body()
                ct.write(memoryview(ubuf)[:end] if end < len(ubuf) else ubuf)
                up.buf = ubuf[end:]
                self._response_done(up, p.keep_alive)
                return
            if what is ENDS_AT_CLOSE:
                ct.write(ubuf)  # delimited by the Engine closing the connection
                up.buf = b""
                resp.fire(Ev.UNTIL_CLOSE)
                return
            pos = p.body(ubuf, end)
            ct.write(ubuf if pos == len(ubuf) else memoryview(ubuf)[:pos])
            up.buf = ubuf[pos:]
            if p.done:
                self._response_done(up, p.keep_alive)
                return
            resp.fire(Ev.BODY)

    def _response_done(self, up: Upstream, keep: bool) -> None:
        conn = self.conn
        exchange = conn.exchange
        assert exchange is not None
        conn.exchange = None
        if up.buf:
            log.warning("the Engine sent %d bytes after a response", len(up.buf))
            keep = False
        act = conn.talk.answer_ended(keep and exchange.keep and not conn.link.eof_sent)
        if act is CLOSE:
            conn.close()
        elif act is GO_ON:
            if conn.flow.paused:
                conn.flow.resume_client(Pause.AHEAD)
            if conn.buf or conn.client_eof:
                conn.advance()

    def _hijack(self, up: Upstream) -> None:
        """From now on both directions are raw byte pipes; EOFs pass on as write-EOFs."""
        conn = self.conn
        conn.talk.fire(Ev.HIJACK)
        ut = up.transport
        assert ut is not None
        if conn.buf:
            ut.write(conn.buf)
            conn.buf = b""
        if conn.client_eof and not conn.link.eof_sent:
            conn.link.eof_sent = True
            ut.write_eof()
        conn.flow.resume_client(Pause.AHEAD)

    def eof(self, up: Upstream) -> bool:
        conn = self.conn
        if up is not conn.link.up:
            return False
        if conn.link.resp.state is Resp.RAW:
            if conn.ct is not None and not conn.ct.is_closing():
                conn.ct.write_eof()
            if conn.client_eof:
                conn.close()
            return True
        self._up_gone(up)
        return False

    def lost(self, up: Upstream) -> None:
        conn = self.conn
        if up is not conn.link.up:
            return
        if conn.link.resp.state is Resp.RAW:
            conn.close()
        elif not up.eof:
            self._up_gone(up)

    def _up_gone(self, up: Upstream) -> None:
        """The Engine closed our upstream connection (outside a hijack)."""
        conn = self.conn
        act = conn.talk.upstream_closed(bool(conn.exchange and conn.exchange.answered))
        if act is Act.SETTLE:
            conn.link.collect(up, eof=True)
        elif act is Act.REPLY_502:
            log.error("the Engine closed the connection before answering")
            conn.reply_error(502, "gpu-alloc shim: the Engine closed the connection")
        elif act is CLOSE:
            conn.close()  # a truncated exchange: the client must see the connection end
        else:
            conn.link.drop()  # idle: reconnect for the next request
