"""The outcomes every model family reports the same way, whatever it computes: a request that cannot run as given,
a Stop, and live options a loaded engine cannot take in place. The worker maps them to their own failure kinds;
everything else is an internal error."""


class RequestError(ValueError):
    """A request that cannot run as given; the message says what to change (shown to the user as is)."""


class ReloadNeeded(Exception):
    """The loaded pipeline cannot take the job's live options in place (families.py): the engine starts its workers
    again with them and runs the job there."""


class Cancelled(Exception):
    """The caller asked to stop; raised at a step boundary. `extra` (set by a task that keeps something, e.g. an
    extension's finished windows) travels to the driver."""

    extra: dict | None = None
