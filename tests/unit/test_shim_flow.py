"""Flow control between a shim connection's two sockets (shim/flow.py)."""

from __future__ import annotations

from shim.flow import HIGH_WATER, LOW_WATER, FlowControl, Pause


class Transport:
    """Records what flow control asks of a transport."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.limits: tuple[int, int] | None = None

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        self.limits = (high, low)


def test_the_client_resumes_only_when_no_reason_to_pause_is_left() -> None:
    client = Transport()
    flow = FlowControl()
    flow.attach_client(client)  # type: ignore[arg-type]
    flow.pause_client(Pause.CONNECT)
    flow.pause_client(Pause.AHEAD)
    flow.pause_client(Pause.PEER)
    flow.resume_client(Pause.CONNECT)
    flow.resume_client(Pause.CONNECT)  # twice: the second is nothing
    flow.resume_client(Pause.PEER)
    assert client.calls == ["pause"] and flow.paused
    flow.resume_client(Pause.AHEAD)
    assert client.calls == ["pause", "resume"] and not flow.paused


def test_a_full_client_socket_pauses_the_engine_and_a_new_upstream_reads_freely() -> None:
    client, upstream = Transport(), Transport()
    flow = FlowControl()
    flow.attach_client(client)  # type: ignore[arg-type]
    flow.attach_upstream(upstream)  # type: ignore[arg-type]
    assert client.limits == upstream.limits == (HIGH_WATER, LOW_WATER)
    flow.pause_upstream()
    flow.pause_client(Pause.PEER)  # the Engine's socket is full too
    flow.resume_upstream()
    flow.resume_upstream()
    assert upstream.calls == ["pause", "resume"]
    flow.pause_upstream()
    flow.attach_upstream(None)  # dropped: the client is no longer held for the old one
    assert client.calls == ["pause", "resume"] and not flow.upstream_paused
