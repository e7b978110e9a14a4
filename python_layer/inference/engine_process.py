"""The engine loop in a process of its own, as vLLM v1's EngineCore and SGLang's scheduler run: the server's
event loop and the engine's Python then never wait for one another's GIL. The server sends commands and gets
each step's deltas and the engine's metrics back through a pipe, a thread of its own at each end of it in the
server's process, so that neither the event loop nor the engine ever blocks on the other."""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import signal
import threading
from multiprocessing.connection import Connection
from typing import Callable, List, Optional

from ..tokenizer.qwen_tokenizer import get_tokenizer, tokenizer_for_checkpoint
from .engine_core import STOP, Command, EngineInfo, NextCommands, Publish, run_engine_loop
from .inference_engine import InferenceEngine

EngineBuilder = Callable[[], InferenceEngine]
"""Builds the engine in the engine process: a picklable callable (a module function, or functools.partial of one)."""


class ProcessCore:
    """Starts the engine process and waits until its engine is built (raises what building it raised)."""

    def __init__(self, build: EngineBuilder) -> None:
        context = multiprocessing.get_context("spawn")  # the server's threads must not be forked
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_engine_process, args=(build, child_conn), name="mili-engine",
                                        daemon=True)
        self._process.start()
        child_conn.close()
        try:
            kind, value = self._conn.recv()
        except EOFError:
            self._process.join()
            code = self._process.exitcode
            raise RuntimeError(f"the engine process exited while loading (exit code {code})") from None
        if kind == "failed":
            self._process.join()
            raise value
        self.info: EngineInfo = value
        self.tokenizer = tokenizer_for_checkpoint(value.model_path) if value.model_path else get_tokenizer()
        self._outbox: "queue.SimpleQueue[Optional[List[Command]]]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []

    def start(self, publish: Publish, on_exit: Callable[[], None]) -> None:
        self._threads = [
            threading.Thread(target=self._send_loop, name="mili-engine-send", daemon=True),
            threading.Thread(target=self._receive_loop, args=(publish, on_exit), name="mili-engine-receive",
                             daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def send(self, commands: List[Command]) -> None:
        self._outbox.put(commands)

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def join(self, timeout: float) -> None:
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._outbox.put(None)
        for thread in self._threads:
            thread.join(timeout)

    def _send_loop(self) -> None:
        while (commands := self._outbox.get()) is not None:
            try:
                self._conn.send(commands)
            except OSError:  # the engine process is gone: the receive loop says so
                return

    def _receive_loop(self, publish: Publish, on_exit: Callable[[], None]) -> None:
        try:
            while True:
                message = self._conn.recv()
                if message is None:
                    break
                publish(*message)
        except (EOFError, OSError):
            pass
        on_exit()


def _engine_process(build: EngineBuilder, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops it: a stop command, or the pipe closing
    try:
        engine = build()
    except BaseException as e:  # noqa: BLE001 - whatever failed goes back to the server, which raises it
        conn.send(("failed", _picklable(e)))
        return
    conn.send(("ready", EngineInfo.of(engine)))
    run_engine_loop(engine, _pipe_commands(conn), lambda *message: conn.send(message))
    conn.send(None)


def _pipe_commands(conn: Connection) -> NextCommands:
    def next_commands(block: bool) -> List[Command]:
        commands: List[Command] = []
        try:
            while conn.poll(None if block and not commands else 0):
                commands += conn.recv()
        except (EOFError, OSError):  # the server went away
            commands.append(STOP)
        return commands

    return next_commands


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.dumps(error)
        return error
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(error).__name__}: {error}")
