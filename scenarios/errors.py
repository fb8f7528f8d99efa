"""The exception that means "the workload input is wrong" (config value, trace or length file)."""


class WorkloadError(ValueError):
    """Bad workload input: names the field, the value, and what would be valid.

    Same signature and message as ``sim.errors.ConfigError`` so entry points can print
    ``str(error)`` as one line; ``scenarios`` never imports ``sim``.
    """

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(field, value, expected)  # every field in args, so it pickles

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.expected}"
