"""SeedVR2Pipeline: what one SeedVR2 worker rank runs (backend/families.py's contract: `run(request, on_step,
should_stop)`). A video is restored in batches of frames (batches.py; the batch size checked before any work
against the free memory where it runs, the device's or a CPU engine's host's, and the frame sink against the host's,
memory.py); each batch is one restoration step (restore.py); batches are cross-faded
where they overlap and each frame goes to the sink (a streamed MP4 or host memory) as soon as it is final. Progress
is per batch; Stop is honoured between batches and inside one (restore.py: at its stage borders, between the DiT's
blocks and, on one rank, between the VAE's time slices), every rank agreeing, keeping the frames already final with
the input's sound cut to them."""

from __future__ import annotations

import time
from typing import Callable

import torch

from ...device_memory import cuda_free_bytes, host_free_bytes
from ...errors import Cancelled, RequestError
from ...manifest import StageRecorder, pipeline_part
from ...media.frame_sinks import FileSink, MemorySink, audio_under
from .batches import StreamBlender, padded_frames, plan_shots
from .memory import batch_memory, check_host, plan_memory, sink_bytes_per_pixel, vae_scale
from .preprocess import plan_geometry
from .request import UpscaleRequest, UpscaleResult
from .scene_cuts import find_cuts
from .restore import batch_generator, restore_batch


class SeedVR2Pipeline:
    def __init__(self, components, runtime):
        self.c = components
        self.parallel = runtime.parallel
        self.runtime = runtime

    def _routing_for(self):
        if not self.parallel.is_parallel:
            return None
        from ...parallel.seedvr2_window_shard import ShardedWindowRouting

        config = self.c.config

        def make(grid):
            return ShardedWindowRouting(self.parallel, grid, config.layers, config.window_counts)

        return make

    def _free_bytes(self) -> int | None:
        """The least free device memory over the ranks (every rank must choose the same batch, or refuse together:
        a rank planning alone could leave the others waiting in a collective), counting what the offload placement
        can take back from its own weights. None on the CPU."""
        if self.c.device.type != "cuda":
            return None
        free = cuda_free_bytes(self.c.device)  # the allocator's cache is free memory for this check
        if self.c.placement is not None:
            free += self.c.placement.releasable_bytes()
        return self.parallel.min(int(free))

    def _host_free_bytes(self) -> int | None:
        """The least free host memory over the ranks (as _free_bytes); None when a rank's host reports none."""
        free = host_free_bytes()
        least = self.parallel.min(-1 if free is None else int(free))
        return None if least < 0 else least

    def plan(self, req: UpscaleRequest):
        """(geometry, batch plan, memory plan) of a request, or a RequestError before any work."""
        frames = req.frames
        size = (req.width, req.height) if req.width is not None else None
        geometry = plan_geometry(frames.shape[1], frames.shape[2], scale=req.scale, short_side=req.short_side,
                                 size=size, fit=req.edge)
        if req.vae_tile and self.parallel.is_parallel:
            raise RequestError(f"A VAE tile runs on one GPU; this engine has {self.parallel.world} (each GPU "
                               "encodes and decodes whole frames of its time slices): set the VAE tile to 0 or load "
                               "the model on one GPU (sp_degree 1).")
        act = torch.finfo(self.c.dtype).bits // 8
        vae_act = torch.finfo(self.c.vae_dtype).bits // 8
        world = self.parallel.world
        # Checked where the memory is used: the batch on the device (the host's memory for a CPU engine, the ranks
        # sharing it) and the driver's frame sink on the host.
        sink = sink_bytes_per_pixel(req.num_frames, streamed=bool(req.output_path))
        what = "the encoder's buffers" if req.output_path else "the result held in memory"
        device_free, host_free = self._free_bytes(), self._host_free_bytes()
        model = dict(vae_scale=vae_scale(self.c.vae.config))
        if device_free is None:  # a CPU engine: the batch lives on the host
            device_free = None if host_free is None else host_free // world
            model.update(reserved_per_pixel=sink / world, where="in host memory" + (
                f" per rank (its {world} ranks share the host)" if world > 1 else ""))
        else:
            check_host(*geometry.output, sink, host_free, what)
            if self.c.placement is not None:  # the weights each stage brings in beside its activations
                model.update(zip(("dit_weights", "vae_weights"), self.c.placement.stage_weights()))
        # Automatic VAE tiles on a GPU engine (a CPU engine's host memory names the largest output instead)
        memory = plan_memory(self.c.config, req.batch_frames, req.num_frames, *geometry.model, *geometry.source,
                             act, vae_act, device_free, world, req.vae_tile, auto_tiles=self.c.device.type == "cuda",
                             **model)
        batch = min(memory.batch, padded_frames(req.num_frames))
        if self.c.placement is not None:
            need = batch_memory(self.c.config, batch, *geometry.model, *geometry.source, act, vae_act, world,
                                memory.vae_tiles, vae_scale=model["vae_scale"])
            self.c.placement.plan_request(need.dit, max(need.encode, need.decode))
        overlap = req.overlap if req.batch_frames else min(req.overlap, (batch - 1) // 2)
        # every rank finds the same cuts in the same frames (a deterministic host computation)
        cuts = find_cuts(req.frames) if req.scene_cuts else []
        return geometry, plan_shots(req.num_frames, batch, overlap if req.num_frames > batch else 0, cuts), memory

    @torch.no_grad()
    def run(self, req: UpscaleRequest, on_step: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> UpscaleResult:
        req.validate()
        t0 = time.perf_counter()
        recorder = StageRecorder(self.c.device)
        geometry, plan, memory = self.plan(req)
        out_h, out_w = geometry.output
        p = self.parallel
        sink = blender = None
        if p.is_driver:
            if req.output_path:
                enc = req.encode_options
                sink = FileSink(req.output_path, out_w, out_h, req.fps, self.c.device, req.sample_rate,
                                enc.get("crf", 19), enc.get("preset", "medium"), enc.get("metadata", {}))
            else:
                sink = MemorySink()
            blender = StreamBlender(plan)
        routing_for = self._routing_for()
        timings: dict = {"batches": plan.count, "batch_frames": plan.batch}
        done = 0
        batch_s = []

        def check(k: int) -> None:  # every rank asks at the same points, so all of them stop there or none does
            if p.any(should_stop is not None and should_stop()):
                raise Cancelled(f"Stopped in batch {k + 1}/{plan.count}.")

        try:
            for k, (start, stop) in enumerate(plan.spans):
                tb = time.perf_counter()
                check(k)
                if sink is not None:
                    sink.check()  # a failed write (a full disk) ends the run here, not after the remaining batches
                frames = restore_batch(self.c, req.frames[start:stop], geometry, req.color_fix,
                                       batch_generator(req.seed, k), p, routing_for,
                                       self.runtime.attention, timings if req.timings else None,
                                       vae_tile=memory.vae_tiles, check=lambda k=k: check(k),
                                       frame_stats=req.vae_tile_stats == "frame")
                if blender is not None:
                    for chunk in blender.push(frames):
                        sink.write(chunk)
                done = k + 1
                batch_s.append(time.perf_counter() - tb)
                if on_step is not None:
                    on_step(done, plan.count)
        except Cancelled as exc:
            exc.extra = self._finish_partial(req, sink, blender, done, plan.count)
            raise
        except BaseException:
            if sink is not None:
                sink.abort()
            raise
        timings["total_s"] = time.perf_counter() - t0
        if self.c.device.type == "cuda":
            timings["peak_device_mb"] = torch.cuda.max_memory_allocated(self.c.device) / 2**20
        frames = None
        if sink is not None:
            if req.audio is not None and isinstance(sink, FileSink):
                sink.write_audio(req.audio, req.sample_rate)  # the input's sound, unchanged
            with recorder.stage("encode_save_s"):  # the streamed file's tail (the rest overlaps the batches)
                sink.close()
            if isinstance(sink, MemorySink):
                frames = sink.result()[0]
        result = UpscaleResult(frames, out_w, out_h, req.num_frames, plan.count, req.output_path, timings=timings)
        result.manifest = self._manifest(req, recorder, geometry, plan, memory, timings, batch_s)
        return result

    def _manifest(self, req, recorder, geometry, plan, memory, timings: dict, batch_s: list) -> dict:
        """The request's manifest (every rank gathers the peaks). Stage seconds beyond the total come from the
        request's `timings=True` path; per-batch host seconds always."""
        out_h, out_w = geometry.output
        shapes = {"input": list(req.frames.shape[:3]), "output": [req.num_frames, out_h, out_w],
                  "model": list(geometry.model), "batches": plan.count, "batch_frames": plan.batch,
                  "scene_cuts": list(plan.cuts)}
        shapes["vae_tiles"] = {"encode": memory.vae_tiles[0], "decode": memory.vae_tiles[1],
                               "chosen": "auto" if memory.auto_tiles else ("asked" if req.vae_tile else "whole"),
                               "stats": req.vae_tile_stats if any(memory.vae_tiles) else None}
        stage_timings = {"total_s": timings["total_s"]}
        if "decode_s" in timings:
            stage_timings["decode_s"] = timings["decode_s"]
        m = pipeline_part(recorder, self.parallel, kind="upscale", family="seedvr2", task="upscale", shapes=shapes,
                          seed=req.seed, steps=1, timings=stage_timings)
        m["extra_stages"] = {k: v for k, v in timings.items() if k.endswith("_s") and k not in ("total_s", "decode_s")}
        m["extra_stages"]["batch_s"] = list(batch_s)
        m["engine"]["vae_dtype"] = str(self.c.vae_dtype).removeprefix("torch.")
        if self.c.placement is not None:  # the policy itself is the engine's "weights" (engine_part)
            m["engine"]["placement"] = self.c.placement.report()
        return m

    @staticmethod
    def _finish_partial(req: UpscaleRequest, sink, blender, done: int, planned: int) -> dict:
        """On Stop: publish the frames already final (a file with them and the sound that plays under them, or none
        when nothing finished)."""
        if sink is None:
            return {}
        emitted = blender.emitted if blender is not None else 0
        if emitted and not isinstance(sink, MemorySink):
            if req.audio is not None:
                sink.write_audio(audio_under(req.audio, emitted, req.sample_rate, req.fps), req.sample_rate)
            sink.close()
        else:
            sink.abort()
        return {"batches_done": done, "batches": planned, "frames_done": emitted}

