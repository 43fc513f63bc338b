"""The SDK's errors: one base class, and the job master's refusals with its reason."""


class BrainError(RuntimeError):
    """Something the SDK cannot do, with what to change."""


class CheckpointDamaged(BrainError):
    """A checkpoint's files are damaged: a file gone or cut short, its SHA-256 not its
    manifest's, the manifest unreadable. `restore()` tells the job master, which falls back to
    an older checkpoint it keeps."""


class Refused(BrainError):
    """The job master refused a call, and said why (a stale incarnation, a lease asked from a
    rendezvous round the group has left, a shard not leased to this process...)."""

    def __init__(self, call: str, code: str, reason: str):
        super().__init__(f"the job master refused {call}: {reason} ({code})")
        self.call = call
        self.code = code
        self.reason = reason
