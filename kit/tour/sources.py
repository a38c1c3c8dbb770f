"""The playground's server sources: the model to ask an endpoint for (:func:`served_model`) and an engine the kit
launches (:func:`launch_url`), cancelled by Stop or the tour stopping."""

from __future__ import annotations

import asyncio

from kit.errors import UserError
from kit.tour.work import in_daemon

#: seconds a launched engine may take to answer
LAUNCH_READY_S = 600.0


async def served_model(url: str, model: str, stall: float, send) -> str:
    """The model to ask ``url`` for: ``model`` when the server lists it, the first listed when empty (said on
    the page).

    Raises:
        UserError: ``model`` is not among the models ``url`` serves (the message lists them), or the list
            cannot be read while a model was asked for.
    """
    from kit.serve.client import DEFAULT_API_KEY_ENV, list_model_ids
    from kit.tour.generate import CONNECT_S

    try:
        ids = await list_model_ids(url, DEFAULT_API_KEY_ENV, timeout_s=CONNECT_S + stall)
    except UserError:
        if model:  # the server may not list its models: ask for the one named and let it answer
            return model
        raise
    if not model:
        await send({"type": "note", "message": f"model: {ids[0]} (the first {url} lists; set served model)"})
        return ids[0]
    if model not in ids:
        raise UserError(f"{url} does not serve model {model!r}; it serves: {', '.join(ids[:20])}")
    return model


async def launch_url(tour, req: dict, job, send) -> str | None:
    """For :class:`kit.tour.server.TourServer` ``tour`` (its out dir, server python, launched and launching
    servers, halt flag) and the generation ``job`` (its stop flags): an engine the kit launches
    (:class:`kit.serve.launch.Server` from a :class:`kit.serve.recipes.LaunchSpec`:
    ``server`` vllm | sglang | transformers, ``model`` a local checkpoint directory; empty: the kit's tiny
    checkpoint, :func:`kit.serve.checkpoint.build_tiny_checkpoint`, under the out dir), started on first use and
    kept. None when Stop (or the tour stopping) came first: the launch is cancelled, its process group killed.

    Raises:
        UserError: a model that is not a local checkpoint directory (a launch must not wait on downloads), an
            engine not installed in the server's python (named with ``--server-python``), a server that did
            not start (its log named).
    """
    from dataclasses import replace

    from kit._io import free_port
    from kit.models import is_checkpoint_dir
    from kit.serve.launch import Server
    from kit.serve.launched import engine_version
    from kit.serve.recipes import LaunchSpec

    server, model = str(req.get("server") or "vllm"), str(req.get("model") or "").strip()
    if not model:
        from kit.serve.checkpoint import build_tiny_checkpoint

        await send({"type": "note", "message": "building the kit's tiny local checkpoint ..."})
        model = str(await in_daemon(build_tiny_checkpoint, tour.out_dir / "tiny-checkpoint"))
    elif not is_checkpoint_dir(model):
        raise UserError(
            f"model {model!r} is not a local checkpoint directory: a launched server gets a directory with "
            "config.json and weights (empty: the kit's tiny checkpoint, built locally), never a hub name to "
            "download"
        )
    key = (server, model)
    if key not in tour._launched:
        spec = LaunchSpec(server, model, server_python=tour.server_python).validate()
        if server != "transformers" and await in_daemon(engine_version, spec) is None:
            py = tour.server_python or "this python"
            raise UserError(
                f"{server} is not installed in {py}: start the tour with --server-python PATH, the python of "
                f"the environment that has {server} (e.g. /opt/{server}-venv/bin/python)"
            )
        spec = replace(spec, port=free_port())
        srv = Server(spec, log_path=tour.out_dir / "servers" / f"{server}.log")
        await send({"type": "note", "message": f"starting {server} on {model} (log {srv.log_path}) ..."})

        def up():
            if job.thread_stop.is_set() or tour._halt.is_set():
                return
            srv.start_ready(LAUNCH_READY_S)

        tour._starting.add(srv)
        waiting = in_daemon(up)
        halt = asyncio.ensure_future(job.async_stop.wait())
        try:
            await asyncio.wait({waiting, halt}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():  # Stop: kill the process group; its wait then ends by itself
                job.thread_stop.set()
                await in_daemon(srv.stop, 5.0)
                return None
            if job.thread_stop.is_set() or tour._halt.is_set():
                await in_daemon(srv.stop, 5.0)
                return None
            try:
                waiting.result()
            except Exception as e:  # noqa: BLE001 - the server's own failure, said on the page
                raise UserError(f"{server} did not start ({e}); log {srv.log_path}") from None
        finally:
            halt.cancel()
            tour._starting.discard(srv)
        tour._launched[key] = srv
    return tour._launched[key].url
