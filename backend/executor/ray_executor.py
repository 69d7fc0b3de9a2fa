"""`ray` executor: the same worker ranks as Ray actors on a Ray cluster (for more than one machine).

Ray is an optional extra (`pip install "comfyui-h3[ray]"`), imported only when this executor is chosen. The cluster is
`EngineConfig.ray_address` ("auto", "ray://head:10001", ...); "" or "local" starts a local Ray for this engine (or
uses the one this process already started). Each rank is one non-detached actor (1 CPU, plus 1 GPU on CUDA), placed
together through a placement group, so a cluster too small fails at once instead of starting half a group. The ranks
form one torch.distributed group over tcp:// on the rank-0 actor's node IP and a free port there: NCCL between GPUs
(gloo for the CPU-side Stop flag), gloo on CPU. Every rank runs `worker.run_job`, the same job logic as the `mp`
worker.

Driver <-> ranks: a small control actor carries rank 0's Progress to the driver and the driver's Stop flag to every
rank, which reads it at each denoise-step boundary (the pipeline all-reduces it, so all ranks stop at the same step).
The driver waits on the ranks' futures with a short timeout: Stop, progress and a dead actor (its future fails) are
noticed within ~0.1 s; a dead rank kills the rest and comes back as WorkerDied. Actors are owned by this driver and
die with it; a local Ray we started is shut down with the executor.

Liveness, as in the `mp` executor (liveness.py): each rank's heartbeat thread calls the control actor every beat,
every step boundary counts as progress there, and the driver reads both with each drain (itself bounded: a frozen
control actor is found too). A Ray actor that is frozen (SIGSTOP, a hung driver call) is not dead to Ray, so the
watchdog decides: a rank silent past the bound, or a Stop not acknowledged / not honoured in time, kills the group
(ray.kill also ends a stopped process) and the next run starts a fresh one.

Code on the cluster: the actors import `comfyui_h3` from the driver's path (PYTHONPATH) or from an install on each
node; `model_dir` must exist on every node that holds a rank.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from typing import Callable, Iterator

from .liveness import BEAT_S, Bounds, Heartbeat, Watchdog, WorkerHung
from .messages import Done, Failed, Job, Progress, Ready
from .mp_executor import WorkerDied, WorkerFailed, _package_parent

POLL_S = 0.1
PLACEMENT_TIMEOUT_S = 120.0  # a cluster that cannot hold every rank fails within this, with what it has
FAILURE_GRACE_S = 5.0  # after one rank fails, how long the others get to finish (or be seen dead) before a restart
CONTROL_TIMEOUT_S = 10.0  # the control actor answers a drain within this, or it is frozen
LOCAL_ADDRESSES = ("", "local")
INSTALL_HINT = 'The "ray" executor needs Ray, an optional extra: pip install "comfyui-h3[ray]"'


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} (import ray failed: {exc}).") from None
    return ray


class _Control:
    """Actor between the driver and the ranks: rank 0 pushes Progress, the driver drains it; the driver sets Stop,
    every rank reads it at each step boundary (a progress mark of that rank). The ranks' heartbeat threads beat here;
    a beat while a Stop is pending acknowledges it."""

    def __init__(self, world: int = 1):
        self._events: list = []
        self._stop = 0  # the Stop token (the job id), 0: none
        self._beats, self._marks, self._acks = [0] * world, [0] * world, [0] * world

    def push(self, event) -> None:
        self._events.append(event)

    def drain(self) -> tuple[list, tuple]:
        events, self._events = self._events, []
        return events, (list(self._beats), list(self._marks), list(self._acks))

    def set_stop(self, token: int) -> None:
        self._stop = int(token)
        if not token:
            self._events = []

    def stop(self, rank: int | None = None) -> bool:
        if rank is not None:
            self._marks[rank] += 1
        return bool(self._stop)

    def beat(self, rank: int) -> None:
        self._beats[rank] += 1
        if self._stop:
            self._acks[rank] = self._stop


class _RankActor:
    """One worker rank. Methods run one at a time (a plain, non-threaded actor), on the actor's main thread."""

    def __init__(self, rank: int, world_size: int, engine_config, control):
        self.rank, self.world_size, self.config, self.control = rank, world_size, engine_config, control
        self.pipeline = None
        # Beats come from a thread, so a main thread stuck in a device call or a collective still beats; a stopped
        # process does not. Fire and forget: the driver judges from what reaches the control actor.
        Heartbeat(lambda: control.beat.remote(rank), lambda token: None, lambda: 0, interval_s=BEAT_S).start()

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it: the rendezvous of the process group (asked of rank 0)."""
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int):
        from .worker import load_failure, setup_rank

        # Ray shows an actor only the GPU it was given: on CUDA this rank's device is always cuda:0.
        device = "cpu" if self.config.device == "cpu" else "cuda:0"
        try:
            self.pipeline, ready = setup_rank(self.rank, self.world_size, self.config, master_addr, master_port,
                                              device=device)
        except BaseException as exc:  # noqa: BLE001 - everything must reach the driver as a message
            return load_failure(exc)
        return ready

    def run(self, job):
        import ray

        from .worker import run_job

        control, rank = self.control, self.rank
        control.stop.remote(rank)  # the job started: a progress mark

        def should_stop() -> bool:  # a step boundary: also this rank's progress mark
            return bool(ray.get(control.stop.remote(rank)))

        def emit(event) -> None:  # acknowledged: every step's progress is there before the result is
            ray.get(control.push.remote(event))

        return run_job(self.pipeline, self.rank, job, emit, should_stop, self.config.family)

    def ping(self) -> int:
        return os.getpid()

    def close(self) -> None:
        from .worker import close_process_group

        self.pipeline = None
        close_process_group()


class RayExecutor:
    """Same interface as MpExecutor: start(on_wait) / alive / run(kind, request, should_cancel) / shutdown(timeout) /
    ready."""

    def __init__(self, config, bounds: Bounds | None = None):
        self.config = config
        self.bounds = bounds or Bounds.from_env()
        self._watchdog: Watchdog | None = None
        self._ray = import_ray()  # fails here, with the install hint, when the extra is missing
        self._actors: list = []
        self._control = None
        self._pg = None
        self._owns_ray = False
        self._dead = False
        self._ids = itertools.count(1)
        self.ready: list[Ready] = []

    # -- lifecycle -------------------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Every rank's actor answers (or is busy). A dead one is seen within the ping's wait."""
        ray = self._ray
        if self._dead or not self._actors or not ray.is_initialized():
            return False
        pings = [a.ping.remote() for a in self._actors]
        done, _ = ray.wait(pings, num_returns=len(pings), timeout=0.5)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                self._dead = True
                return False
        return True

    def start(self, on_wait: Callable[[], None] | None = None) -> None:
        ray = self._ray
        n = self.config.world_size
        try:
            self._connect()
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            gpu = self.config.device != "cpu"
            bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
            parent = _package_parent()
            env = {"PYTHONPATH": os.pathsep.join(p for p in (parent, os.environ.get("PYTHONPATH")) if p)}
            if self.config.cpu_threads:
                env["OMP_NUM_THREADS"] = str(self.config.cpu_threads)
            self._control = ray.remote(num_cpus=0)(_Control).options(runtime_env={"env_vars": env}).remote(n)
            self._pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
            if not self._wait([self._pg.ready()], on_wait, PLACEMENT_TIMEOUT_S):
                raise WorkerFailed(Failed(None, "error", (
                    f"The Ray cluster could not place {n} rank(s) of {bundle} each within {PLACEMENT_TIMEOUT_S:.0f} s "
                    f"(available now: {ray.available_resources()}).")))
            actor_cls = ray.remote(_RankActor)
            for rank in range(n):
                self._actors.append(actor_cls.options(
                    num_cpus=1, num_gpus=1 if gpu else 0, max_restarts=0, runtime_env={"env_vars": env},
                    name=None, scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._pg, placement_group_bundle_index=rank),
                ).remote(rank, n, self.config, self._control))
            self._gather([self._control.stop.remote()], on_wait)  # the control actor is up (it imports us too)
            self._watchdog = Watchdog(n, self.bounds)  # from here every wait also watches the ranks' heartbeats
            master = ("127.0.0.1", 0)
            if n > 1:
                master = self._get(self._actors[0].address.remote(), on_wait)
            refs = [a.setup.remote(*master) for a in self._actors]
            for msg in self._gather(refs, on_wait):
                if isinstance(msg, Failed):
                    raise WorkerFailed(msg)
                self.ready.append(msg)
            self._watchdog.loaded()
        except BaseException:
            self.shutdown(timeout=2.0)
            raise

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return  # the host (or a test) already chose the cluster: use it and leave it running
        address = self.config.ray_address.strip()
        try:
            if address in LOCAL_ADDRESSES:
                cpus = max(os.cpu_count() or 1, self.config.world_size) if self.config.device == "cpu" else None
                ray.init(num_cpus=cpus, include_dashboard=False)
            else:
                ray.init(address=address)
        except Exception as exc:  # noqa: BLE001
            where = "a local Ray" if address in LOCAL_ADDRESSES else f"the Ray cluster at {address!r}"
            raise WorkerFailed(Failed(None, "error", f"Could not start or reach {where}: {type(exc).__name__}: "
                                                     f"{exc}")) from None
        self._owns_ray = True

    def shutdown(self, timeout: float = 10.0) -> None:
        ray = self._ray
        actors, self._actors = self._actors, []
        control, pg = self._control, self._pg
        self._control = self._pg = self._watchdog = None
        self.ready = []
        self._dead = True
        if ray.is_initialized():
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            # Wait until they are gone (GPU memory freed) before a restart places new ones on the same GPUs.
            pings = []
            for actor in actors:
                with contextlib.suppress(Exception):
                    pings.append(actor.ping.remote())
            deadline = time.monotonic() + max(timeout, 0.5)
            while pings and time.monotonic() < deadline:
                done, pings = ray.wait(pings, num_returns=len(pings), timeout=min(POLL_S, timeout))
            if control is not None:
                with contextlib.suppress(Exception):
                    ray.kill(control, no_restart=True)
            if pg is not None:
                from ray.util.placement_group import remove_placement_group

                with contextlib.suppress(Exception):
                    remove_placement_group(pg)
            if self._owns_ray:
                with contextlib.suppress(Exception):
                    ray.shutdown()
        self._owns_ray = False

    # -- jobs ------------------------------------------------------------------------------------------------------

    def run(self, kind: str, request, should_cancel: Callable[[], bool] | None = None,
            live: dict | None = None) -> Iterator:
        """Submit one job to every rank; yield rank 0's Progress; return the result (StopIteration value) or raise
        WorkerFailed / WorkerDied."""
        ray = self._ray
        job = Job(next(self._ids), kind, request, live)
        try:  # before the ranks read it; also drops stale progress
            ray.get(self._control.set_stop.remote(0), timeout=CONTROL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._control_frozen()
        except ray.exceptions.RayActorError as exc:
            self._died(["control"], exc)
        self._watchdog.job_started()
        try:
            refs = [a.run.remote(job) for a in self._actors]
            rank_of = {ref: rank for rank, ref in enumerate(refs)}
            outcomes: dict[int, object] = {}
            pending = list(refs)
            cancelled = False
            grace_until = None
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                for ref in done:
                    try:
                        outcomes[rank_of[ref]] = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        self._died([rank_of[ref]], exc)
                    except ray.exceptions.RayError as exc:  # the call itself failed (e.g. the result did not pickle)
                        outcomes[rank_of[ref]] = Failed(job.job_id, "error", f"{type(exc).__name__}: {exc}")
                if grace_until is None and any(isinstance(o, Failed) for o in outcomes.values()) and pending:
                    grace_until = time.monotonic() + FAILURE_GRACE_S
                for event in self._drain():
                    if isinstance(event, Progress) and event.job_id == job.job_id:
                        yield event
                if not cancelled and should_cancel is not None and should_cancel():
                    cancelled = True
                    self._cancel(job.job_id)
                if grace_until is not None and pending and time.monotonic() > grace_until:
                    # A rank failed and its peers are stuck in a collective: restart the group on next use.
                    self.shutdown(timeout=2.0)
                    raise WorkerFailed(self._first_failure(outcomes))
            failures = [o for o in outcomes.values() if isinstance(o, Failed)]
            if failures:
                raise WorkerFailed(self._first_failure(outcomes))
            result = outcomes[0]
            assert isinstance(result, Done), result
            return result.result
        finally:
            if self._watchdog is not None:
                self._watchdog.job_ended()

    @staticmethod
    def _first_failure(outcomes: dict) -> Failed:
        """The failure that says why: a rank's own error before a peer's agreed Stop."""
        failures = [outcomes[r] for r in sorted(outcomes) if isinstance(outcomes[r], Failed)]
        return next((f for f in failures if f.kind != "cancelled"), failures[0])

    def _died(self, ranks: list[int], exc: BaseException) -> None:
        self.shutdown(timeout=2.0)
        who = "The control actor" if ranks == ["control"] else f"Worker rank(s) {ranks}"
        raise WorkerDied(f"{who} died ({type(exc).__name__}); the engine restarts on next use.")

    def _cancel(self, token: int) -> None:
        if self._control is not None:
            with contextlib.suppress(Exception):
                self._control.set_stop.remote(token)
            if self._watchdog is not None and token > 0:
                self._watchdog.stop_requested(token)

    def _drain(self) -> list:
        """The control actor's pending events; its liveness counters go to the watchdog, whose verdict (a frozen
        rank, an unanswered Stop) kills the group and raises WorkerHung / StopForced."""
        ray = self._ray
        try:
            events, pulse = ray.get(self._control.drain.remote(), timeout=CONTROL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._control_frozen()
        except ray.exceptions.RayActorError as exc:
            self._died(["control"], exc)
        self._watchdog.observe(*pulse)
        verdict = self._watchdog.check()
        if verdict is not None:
            error, message = verdict
            self.shutdown(timeout=2.0)
            raise error(message)
        return events

    def _control_frozen(self) -> None:
        self.shutdown(timeout=2.0)
        raise WorkerHung(f"The Ray control actor did not answer within {CONTROL_TIMEOUT_S:g} s (frozen?); all "
                         "workers were killed and restart on the next run.")

    # -- waiting ---------------------------------------------------------------------------------------------------

    def _wait(self, refs: list, on_wait: Callable[[], None] | None, limit_s: float | None = None) -> bool:
        """Wait for every ref, calling on_wait (which may raise, e.g. Stop while loading) each poll; a ref that
        failed because its actor died -> WorkerDied at once (its peers may be blocked on it). False on timeout."""
        ray = self._ray
        deadline = None if limit_s is None else time.monotonic() + limit_s
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self._died([index[ref]], exc)
            if not pending:
                break
            if self._watchdog is not None:
                self._drain()  # nothing to deliver while starting; a frozen rank is found
            if on_wait is not None:
                on_wait()
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def _get(self, ref, on_wait):
        return self._gather([ref], on_wait)[0]

    def _gather(self, refs: list, on_wait) -> list:
        """Results of the ranks' calls in rank order; an actor that died -> WorkerDied (the rest killed)."""
        self._wait(refs, on_wait)
        return self._ray.get(refs)
