"""Starts the real mesh-provisioner binary on a free port for a test, as the
conformance suite prescribes (conformance/README.md)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CASES = REPO / "conformance" / "cases"
# The flags every conformance runner serves with, after --state-dir.
SERVE_ARGS = ["--listen", "127.0.0.1:0", "--log-format", "json", "--revision-wait", "1s"]


def from_make(name: str) -> str:
    """An environment variable `make test-python` sets."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: run these tests with `make test-python`, which builds the binaries "
            "and sets MESH_PROVISIONER_BIN and MESH_PROVISIONER_APPLY_BIN"
        )
    return value


@asynccontextmanager
async def serve(args: list[str] = SERVE_ARGS) -> AsyncIterator[str]:
    """Runs the binary on a fresh state directory and yields its NATS URL once
    it logs that it serves; stops it with SIGTERM on exit."""
    state_dir = tempfile.mkdtemp(prefix="mesh-provisioner-py-")
    proc = await asyncio.create_subprocess_exec(
        from_make("MESH_PROVISIONER_BIN"), "--state-dir", state_dir, *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    log: list[str] = []
    assert proc.stderr is not None

    async def serving() -> str:
        assert proc.stderr is not None
        async for line in proc.stderr:
            log.append(line.decode(errors="replace").rstrip())
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("msg") == "serving":
                return str(record["nats_url"])
        raise RuntimeError("the server exited before serving:\n" + "\n".join(log))

    async def drain() -> None:  # so that the server never blocks on a full pipe
        assert proc.stderr is not None
        async for line in proc.stderr:
            log.append(line.decode(errors="replace").rstrip())

    drainer: asyncio.Task[None] | None = None
    try:
        url = await asyncio.wait_for(serving(), 20)
        drainer = asyncio.create_task(drain())
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drainer is not None:
            await drainer
        shutil.rmtree(state_dir, ignore_errors=True)


@asynccontextmanager
async def authorized(*, runs_as: bool = False) -> AsyncIterator[dict[str, str]]:
    """Runs the authorizing nats-server (MESH_PROVISIONER_AUTHNATS_BIN: its
    users are the service's two identities and the nodes ace and novox,
    each with what `mesh-provisioner permissions` grants it); yields the URL
    of each identity. With runs_as, its accounts are what `mesh-provisioner
    permissions --runs-as ace,novox` prints: the service's identities in
    PROVISIONER, ace, novox and pg each in an account of its own, which
    imports its own verbs and, a node's, its plan key's writes under
    RUNS_AS_API_PREFIX."""
    proc = await asyncio.create_subprocess_exec(
        from_make("MESH_PROVISIONER_AUTHNATS_BIN"),
        *(["-runs-as"] if runs_as else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        urls: dict[str, str] = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        yield urls
    finally:
        proc.stdin.close()  # it serves until its standard input closes
        await asyncio.wait_for(proc.wait(), 10)


async def apply(url: str, case_file: Path) -> dict[str, int]:
    """Applies a case's writes with the shared Go tool; returns the last
    revision written to each bucket."""
    proc = await asyncio.create_subprocess_exec(
        from_make("MESH_PROVISIONER_APPLY_BIN"), "--nats-url", url, str(case_file),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    if proc.returncode != 0:
        raise RuntimeError(f"apply {case_file.name}: {err.decode()}")
    revisions: dict[str, int] = json.loads(out)
    return revisions
