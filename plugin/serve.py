"""Run the plugin under gunicorn on a unix socket.

The workers are gpu-alloc's own (`plugin.worker`: asyncio, decisions that wait on
a thread pool): dockerd's plugin client keeps connections alive, and a handler
that waits (for the ledger lock) must not stop the same worker from answering
the calls that touch no GPU, including the ones its own Engine calls cause.
gunicorn's arbiter restarts a worker that dies; ``timeout`` kills one that hangs.
No WSGI app: the worker answers every call through `plugin.app.Dispatcher`.

gunicorn removes whatever socket is at its bind path, and unlinks it again on exit:
a second plugin started by hand would leave the live one deaf.  `listener.claim`
runs first, so a second copy refuses before gunicorn ever sees the path.
"""

from __future__ import annotations

import os
from typing import Any

from gunicorn.app.base import BaseApplication

from allocator.host import listener
from allocator.host.config import Config


class _Server(BaseApplication):
    def __init__(self, config: Config, options: dict[str, Any]):
        self.gpu_config = config
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self):
        """What each worker serves (`plugin.worker` asks for it after its fork): the
        Dispatcher, not a WSGI app; gunicorn here keeps the processes, not the HTTP."""
        from plugin.app import create_dispatcher

        dispatcher = create_dispatcher(self.gpu_config)
        work = dispatcher.alloc.background  # in each worker, after its fork
        dispatcher.alloc.gather.watch_policy(work)
        work.start()
        return dispatcher


def options(config: Config) -> dict[str, Any]:
    return {
        "bind": f"unix:{config.plugin.socket}",
        "workers": config.plugin.workers,
        "worker_class": "plugin.worker.Worker",
        "timeout": 30,
        "graceful_timeout": 5,
        "umask": 0o077,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "info",
        "proc_name": "gpu-alloc-plugin",
        "control_socket_disable": True,  # gunicorn 23+: no stray socket under $HOME
    }


def serve(config: Config) -> None:
    os.makedirs(os.path.dirname(config.plugin.socket), exist_ok=True)
    held = listener.claim(config.plugin.socket, "gpu-alloc plugin")
    # Workers drop their copy of the lock, so only the arbiter's life holds it.
    hooks = {"post_fork": lambda server, worker: held.close()}
    try:
        _Server(config, options(config) | hooks).run()
    finally:
        held.close()
